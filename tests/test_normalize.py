from datapipe.schema import new_document
from datapipe.text.normalize import Config, make_stage


def run(text: str, kind: str = "text", **cfg) -> dict:
    return make_stage(Config(stage="normalize", **cfg))([new_document("s", "1", text, kind=kind)])[0]


def test_nfc_composes_characters():
    assert run("cafe\u0301")["text"] == "caf\u00e9"


def test_nfkc_folds_compatibility_forms():
    assert run("\uff11\uff12\uff13", form="NFKC")["text"] == "123"


def test_controls_line_endings_and_spaces():
    doc = run("a\x00b\r\nc  \t d   \r\n\n\n\n\ne\u200b")
    assert doc["text"] == "ab\nc d\n\n\ne"


def test_code_keeps_indentation_and_inner_spaces():
    code = "def f(x):\n    return  x\n"
    assert run(code, kind="code")["text"] == "def f(x):\n    return  x"


def test_empty_after_normalization_is_rejected():
    assert run(" \x00\u200b \n")["reject"] == "normalize.empty_text"
