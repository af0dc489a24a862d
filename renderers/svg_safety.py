"""Hostile-SVG checks, run before any renderer sees the markup.

In order, each rejecting fast with its reason:
1. too_large: more than `max_input_bytes`.
2. entity_bomb / external_reference: the DTD is read alone (expat, parameter entities off,
   nothing fetched) and stops at the first element. An entity whose value refers to another
   entity (the billion-laughs mechanism: 10 levels of 10 references make 10^9), or entities
   and <!ATTLIST> defaults that would expand the file past MAX_ENTITY_EXPANSION (the flat,
   quadratic variant; a default is copied into every element it applies to), is a bomb, found
   as each is declared, before expat expands it; an external (SYSTEM/PUBLIC) entity is an XXE
   attempt. Plain text entities, as Adobe Illustrator writes them, pass.
3. invalid: the tree is parsed (expat, entities now bounded); the root must be <svg>.
4. too_large: more than MAX_DEPTH nesting (resvg segfaults on 20,000 nested groups) or
   MAX_EXPANDED_ELEMENTS once every <use> is expanded (a <use> bomb: 10 levels of 10 uses
   make 10^10 elements; cairosvg spends over 30 s on one); invalid: a <use> cycle.
5. external_reference: every href/src, url(...) in attributes and <style>, @import and
   xml-stylesheet must be a fragment (#id), a data: URI, or a relative path to an existing file
   under the input's asset folder (resolved, symlinks followed), which this process reads and
   inlines as a data: URI: the sandboxed renderer never opens a file. Anything else (http:, file:,
   an absolute path, ../ out of the folder, a missing file) is rejected, or with
   external_refs=strip removed and the tree re-serialized; the stripped markup is then what is
   rendered and what the training sample shows, so code and picture still match.
6. too_large: what this process decodes and reads for one input (embedded SVG images, inflated
   and checked; local files, each distinct reference read once) stops at MAX_INLINED_FACTOR x
   max_input_bytes and MAX_LOCAL_FILES files.
Everything here runs in the caller, outside the sandbox, so every step is linear in the input
and bounded by construction (the tests feed 4 MiB hostile inputs and measure the caller).
"""
from __future__ import annotations

import base64
import io
import mimetypes
import re
import xml.etree.ElementTree as ET
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, unquote_to_bytes
from xml.parsers import expat

from renderers.base import RenderError, RenderOptions, file_inside
from renderers.css_refs import rewrite_css

MAX_ENTITY_EXPANSION = 1 << 20  # characters entities and attribute defaults may add; 1 MiB is 100x any real SVG's
MAX_DEPTH = 256  # real SVGs nest < 30 levels
MAX_NESTED_SVG = 3  # data:image/svg+xml images inside each other
MAX_LOCAL_FILES = 64  # distinct local references inlined; real SVGs embed a handful of images
MAX_INLINED_FACTOR = 2  # embedded SVGs checked plus local files inlined, in bytes, per byte of max_input_bytes
MAX_EXPANDED_ELEMENTS = 200_000  # a 400 KB emoji has ~5,000 elements; a flag with 50 <use> stars ~600
SVG_NS = "http://www.w3.org/2000/svg"
ENTITY_REF = re.compile(r"[&%][A-Za-z_:][\w.:-]*;")
REFERENCE_BYTES = re.compile(rb"[&%]([^&%;\s]+);")  # every &name; and %name; in one pass
TAG_NAME = re.compile(rb"<([^\s/>!?]+)")  # every element start, by its name as written
STYLESHEET_PI = re.compile(r"<\?xml-stylesheet\b", re.IGNORECASE)


@dataclass
class CheckedSvg:
    markup: str  # what to render: `code` with local files inlined as data: URIs
    code: str | None = None  # the re-serialized tree after stripping references; None when unchanged
    stripped: list[str] = field(default_factory=list)  # references removed (external_refs=strip)
    local_files: dict[str, str] = field(default_factory=dict)  # relative reference -> data: URI
    nesting: int = 0  # how deep inside data:image/svg+xml images this document is
    budget: InlineBudget | None = None  # shared with the embedded SVGs it checks


@dataclass
class InlineBudget:
    """What one input may make this process decode and read: each embedded SVG is decoded (an
    svgz inflated) and checked, each local file read and base64-encoded. Without a budget a
    4 MiB input of 400 small svgz images, or of 100,000 spellings of one local image, costs
    gigabytes here, outside the sandbox."""

    bytes_left: int
    files_left: int = MAX_LOCAL_FILES

    def spend(self, size: int, what: str) -> None:
        self.bytes_left -= size
        if self.bytes_left < 0:
            raise RenderError("too_large", f"{what}: embedded SVGs and local files past {MAX_INLINED_FACTOR} x "
                                           "max_input_bytes")


class _DtdDone(Exception):
    """Raised at the first element: the DTD is all the first pass needs."""


def check_svg(code: str, asset_dir: Path | None, options: RenderOptions, nesting: int = 0,
              budget: InlineBudget | None = None) -> CheckedSvg:
    data = code.encode("utf-8", "surrogatepass")
    if len(data) > options.max_input_bytes:
        raise RenderError("too_large", f"{len(data)} bytes > max_input_bytes={options.max_input_bytes}")
    check_entities(data)
    root, namespaces = parse_tree(data)
    check_shape(root)
    asset_dir = asset_dir.resolve() if asset_dir is not None else None  # once, not once per reference
    budget = budget or InlineBudget(MAX_INLINED_FACTOR * options.max_input_bytes)
    return check_references(code, root, namespaces, asset_dir, options, nesting, budget)


def check_entities(data: bytes) -> None:
    """Read the DTD alone, adding up what each declaration will cost when expanded *before* expat
    expands it: an entity's length times its references (counted in one scan of the whole file,
    the DTD's own attribute defaults included), an attribute default's length times the elements
    it applies to. A 2 MiB entity in an ATTLIST default on 500,000 <g/> would otherwise be 1 TB."""
    references = Counter(REFERENCE_BYTES.findall(data))  # one scan: a scan per entity took 17 s on 40,000
    tags = Counter(TAG_NAME.findall(data))  # every <name, comments included: an upper bound
    budget = ExpansionBudget()
    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)

    def on_entity(name, is_parameter, value, base, system_id, public_id, notation):
        if value is None:
            raise RenderError("external_reference", f"external entity {name!r} -> {system_id or public_id}")
        if ENTITY_REF.search(value):
            raise RenderError("entity_bomb", f"entity {name!r} refers to other entities")
        budget.add(len(value) * references[name.encode()], "entity references")

    def on_attlist(element, attribute, kind, default, required):
        budget.add(len(default or "") * tags[element.encode()], f"<{element} {attribute}> defaults")

    def on_start(*_):
        raise _DtdDone

    parser.EntityDeclHandler = on_entity
    parser.AttlistDeclHandler = on_attlist
    parser.StartElementHandler = on_start
    try:
        parser.Parse(data, True)
    except _DtdDone:
        pass
    except expat.ExpatError as err:
        raise RenderError("invalid", f"XML: {err}") from None


class ExpansionBudget:
    """Characters that entity references and attribute defaults may add, summed as declared."""

    def __init__(self):
        self.total = 0

    def add(self, characters: int, what: str) -> None:
        self.total += characters
        if self.total > MAX_ENTITY_EXPANSION:
            raise RenderError("entity_bomb", f"{what} expand to {self.total:,} characters")


def parse_tree(data: bytes) -> tuple[ET.Element, dict[str, str]]:
    """The element tree and the namespace prefixes the document declared (prefix -> uri)."""
    namespaces: dict[str, str] = {}
    depth, root = 0, None
    try:
        for event, item in ET.iterparse(io.BytesIO(data), events=("start-ns", "start", "end")):
            if event == "start-ns":
                namespaces.setdefault(*item)
            elif event == "start":
                root = item if root is None else root
                depth += 1
                if depth > MAX_DEPTH:
                    raise RenderError("too_large", f"elements nest deeper than {MAX_DEPTH}")
            else:
                depth -= 1
    except ET.ParseError as err:
        raise RenderError("invalid", f"XML: {err}") from None
    if root is None or local_name(root.tag) != "svg":
        raise RenderError("invalid", f"root element is <{local_name(root.tag) if root is not None else ''}>, not <svg>")
    return root, namespaces


def local_name(tag: str) -> str:
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def check_shape(root: ET.Element) -> None:
    """Reject <use> amplification: count elements as the renderer would after expanding every use
    (children and a use's target, depth first without recursion, so a deep but finite chain of
    uses is counted, not a RecursionError), and reject a use whose target contains it (a cycle)."""
    by_id = {el.get("id"): el for el in root.iter() if el.get("id")}
    sizes: dict[int, int] = {}  # id(element) -> elements once expanded
    on_path: set[int] = set()
    stack: list[tuple[ET.Element, bool]] = [(root, False)]
    while stack:
        el, children_done = stack.pop()
        if children_done:
            on_path.discard(id(el))
            sizes[id(el)] = 1 + sum(sizes[id(part)] for part in expansion(el, by_id))
            if sizes[id(el)] > MAX_EXPANDED_ELEMENTS:
                raise RenderError("too_large", f"<use> expands to more than {MAX_EXPANDED_ELEMENTS:,} elements")
        elif id(el) not in sizes:
            on_path.add(id(el))
            stack.append((el, True))
            for part in expansion(el, by_id):
                if id(part) in on_path:
                    raise RenderError("invalid", f"<use> cycle: {href_of(el)[:100]!r} contains the <use> itself")
                stack.append((part, False))


def expansion(el: ET.Element, by_id: dict[str, ET.Element]) -> list[ET.Element]:
    """What an element draws: its children, and for a <use> the element it refers to."""
    target = by_id.get(href_of(el).removeprefix("#")) if local_name(el.tag) == "use" else None
    return [*el, target] if target is not None else list(el)


def href_of(el: ET.Element) -> str:
    return next((value for name, value in el.attrib.items() if local_name(name) == "href"), "")


def check_references(code: str, root: ET.Element, namespaces: dict[str, str], asset_dir: Path | None,
                     options: RenderOptions, nesting: int, budget: InlineBudget) -> CheckedSvg:
    result = CheckedSvg(markup=code, nesting=nesting, budget=budget)
    if STYLESHEET_PI.search(code):
        outside(result, "<?xml-stylesheet?>", options)
    for el in root.iter():
        for name, value in list(el.attrib.items()):
            if local_name(el.tag) == "a" and local_name(name) == "href":
                continue  # a link is never fetched by a renderer
            if local_name(name) in ("href", "src") and not is_allowed(value, asset_dir, result, options):
                outside(result, value, options)
                del el.attrib[name]
            elif "url(" in value.lower():
                el.set(name, clean_css(value, asset_dir, result, options))
        if local_name(el.tag) == "style" and el.text:
            el.text = clean_css(el.text, asset_dir, result, options)
    if result.stripped:
        result.code = result.markup = serialize(root, namespaces)
    result.markup = inline_local_files(result.markup, result.local_files)
    return result


def clean_css(css: str, asset_dir: Path | None, result: CheckedSvg, options: RenderOptions) -> str:
    def on_import(statement: str) -> str:
        outside(result, statement, options)  # an imported sheet is never inlined: it is code we did not check
        return ""

    def on_url(reference: str, token: str) -> str:
        if is_allowed(reference, asset_dir, result, options):
            return token
        outside(result, reference, options)
        return "none"

    return rewrite_css(css, on_import, on_url)


def outside(result: CheckedSvg, reference: str, options: RenderOptions) -> None:
    if options.external_refs == "reject":
        raise RenderError("external_reference", reference[:200])
    result.stripped.append(reference[:200])


def is_allowed(reference: str, asset_dir: Path | None, result: CheckedSvg, options: RenderOptions) -> bool:
    """A fragment, a data: URI (an embedded SVG passing these same checks), or an existing file
    inside asset_dir (resolved), no larger than max_input_bytes (kept in local_files), within the budget."""
    reference = reference.strip()
    if not reference or reference.startswith("#"):
        return True
    if reference.lower().startswith("data:"):
        return is_safe_data(reference, asset_dir, result, options)
    if asset_dir is None or re.match(r"^[a-zA-Z][\w+.-]*:|^[/\\]", reference):
        return False  # a scheme (http:, file:, javascript:), an absolute or protocol-relative path
    if reference in result.local_files:
        return True  # read once, however often it is used
    resolved = file_inside(asset_dir, unquote(reference.split("#", 1)[0].split("?", 1)[0]))
    if resolved is None:
        return False
    if resolved.stat().st_size > options.max_input_bytes:
        raise RenderError("too_large", f"{reference}: {resolved.stat().st_size} bytes")
    result.budget.files_left -= 1
    if result.budget.files_left < 0:
        raise RenderError("too_large", f"more than {MAX_LOCAL_FILES} local files")
    result.budget.spend(resolved.stat().st_size, reference[:100])
    mime = mimetypes.guess_type(resolved.name)[0] or "application/octet-stream"
    uri = f"data:{mime};base64,{base64.b64encode(resolved.read_bytes()).decode()}"
    if is_safe_data(uri, None, result, options):
        result.local_files[reference] = uri
        return True
    return False


def inline_local_files(markup: str, local_files: dict[str, str]) -> str:
    """Local references become data: URIs, so the sandboxed renderer never opens a file."""
    for reference, uri in local_files.items():
        for quote in ('"', "'", "(", "('", '("'):
            close = {"(": ")", "('": "')", '("': '")'}.get(quote, quote)
            markup = markup.replace(f"{quote}{reference}{close}", f"{quote}{uri}{close}")
    return markup


def is_safe_data(uri: str, asset_dir: Path | None, result: CheckedSvg, options: RenderOptions) -> bool:
    """Renderers draw an embedded SVG image with the same powers as the outer one: check it too.
    Its own external references reject it whatever external_refs says (it is not re-serialized)."""
    head, _, body = uri.partition(",")
    if "image/svg" not in head.lower():
        return True
    if result.nesting >= MAX_NESTED_SVG:
        raise RenderError("too_large", f"SVG images nested deeper than {MAX_NESTED_SVG}")
    data = base64.b64decode(body + "===", validate=False) if ";base64" in head.lower() else unquote_to_bytes(body)
    if data[:2] == b"\x1f\x8b":  # svgz
        data = zlib.decompressobj(wbits=31).decompress(data, options.max_input_bytes)
    result.budget.spend(len(data), "embedded SVG images")
    strict = options.model_copy(update={"external_refs": "reject"})
    try:
        check_svg(data.decode("utf-8", "replace"), asset_dir, strict, result.nesting + 1, result.budget)
    except RenderError as err:
        if options.external_refs == "reject" or err.reason != "external_reference":
            raise
        return False
    return True


def serialize(root: ET.Element, namespaces: dict[str, str]) -> str:
    """The tree as markup, keeping the document's own prefixes (svg as the default namespace)."""
    for prefix, uri in namespaces.items():
        if prefix and not re.match(r"ns\d+$", prefix):
            ET.register_namespace(prefix, uri)
    ET.register_namespace("", SVG_NS)
    return ET.tostring(root, encoding="unicode")
