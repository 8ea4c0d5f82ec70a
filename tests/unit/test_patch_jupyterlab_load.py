"""images/singleuser/patch_jupyterlab_load.py: its two edits to JupyterLab's bundle, run
as JavaScript (Node) before and after; when it leaves the bundle as it is (the build goes
on, with a warning); and the image's JupyterLab, the one it was derived from. The built
image's bundle
and JupyterLab's "Open Recent" in Chromium: tests/integration/test_images.py; what the
edits save a member at sign-in: bench/member.py."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

IMAGE = Path(__file__).resolve().parents[2] / "images" / "singleuser"
SCRIPT = IMAGE / "patch_jupyterlab_load.py"
spec = importlib.util.spec_from_file_location("patch_jupyterlab_load", SCRIPT)
patch = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = patch  # (its dataclass looks itself up there)
spec.loader.exec_module(patch)

# What the edits do, run by Node. RecentsManager's fields the two methods use are small
# stand-ins: a state database that holds *stored*, a save debouncer that counts, paths
# that no longer exist (*gone*).
RECENTS = """
const o = {stateDBKey: "docmanager:recents"};
class Recents {
  constructor(stored, gone) {
    this._recents = {opened: [], closed: []};
    this.maximalRecentsLength = 10;
    this._serverRoot = "/home/jovyan";
    this.saves = 0;
    this._stateDB = {fetch: async key => key === o.stateDBKey ? stored : undefined};
    this._gone = gone;
    this._saveDebouncer = {invoke: () => { this.saves++; return Promise.resolve(); }};
    this._recentsChanged = {emit: () => {}};
  }
  async _getInvalidPaths(docs) { return docs.map(d => d.path).filter(p => this._gone.includes(p)); }
  METHODS
}
const doc = path => ({path, root: "/home/jovyan"});
const paths = r => r._recents.opened.map(d => d.path);
(async () => {
  const out = {};
  let r = new Recents({opened: [doc("a.ipynb"), doc("b.txt")], closed: [doc("c.py")]}, []);
  await r._loadRecents();
  out.load = [r.saves, paths(r)];
  r._setRecents([doc("d.ipynb"), ...r._recents.opened], "opened");  // as opening one does
  out.open = [r.saves, paths(r)];
  r = new Recents({opened: [doc("a.ipynb"), doc("gone.txt")], closed: []}, ["gone.txt"]);
  await r._loadRecents();
  out.load_dropping = [r.saves, paths(r)];
  r = new Recents(undefined, []);
  await r._loadRecents();
  out.load_nothing = [r.saves, paths(r)];
  console.log(JSON.stringify(out));
})();
"""

# apputils-extension's loadState command as JupyterLab 4.6.6's bundle has it (ending in
# LOAD_STATE's upstream text), registered with stand-ins for what it closes over; the
# workspace's save debouncer answers only when the script says so.
LOAD_STATE_COMMAND = (
    'execute:async e=>{if(o)return;let{hash:t,path:n,search:r}=e,s=m.URLExt.'
    'queryStringToObject(r||""),a="string"==typeof s.clone?""===s.clone?m.PageConfig.'
    'defaultWorkspace:s.clone:null,l=a||u||null;if(null===l)return void console.error('
    '`${h.loadState} cannot load null workspace.`);try{let e=await c.fetch(l);o||(o=!0,'
    'p.resolve({type:"overwrite",contents:e.data}))}catch({message:e}){console.warn('
    '`Fetching workspace "${u}" failed.`,e),o||(o=!0,p.resolve({type:"cancel",contents:'
    'null}))}if(l===a){delete s.clone;let e=n+m.URLExt.objectToQueryString(s)+t,r=_.invoke()'
    '.then(()=>i.stop);return r.then(()=>{i.navigate(e)}),r}await _.invoke()}}),'
    'a.addCommand(h.reset,')
LOAD_STATE = """
let o = false, events = [], release = () => {};
const m = {URLExt: {queryStringToObject: q => Object.fromEntries(new URLSearchParams(q)),
                    objectToQueryString: s => Object.keys(s).length ? "?" + new URLSearchParams(s) : ""},
           PageConfig: {defaultWorkspace: "default"}};
const u = "default", h = {loadState: "load", reset: "reset"}, commands = {};
const c = {fetch: async id => ({data: {id}})};
const p = {resolve: () => events.push("workspace applied")};
const i = {stop: "stop", navigate: url => events.push("navigate " + url)};
const _ = {invoke: () => { events.push("save asked");
                           return new Promise(r => { release = r; }).then(() => events.push("saved")); }};
const a = {addCommand: (id, command) => { commands[id] = command; }};
a.addCommand(h.loadState, {COMMAND {});
async function load(search) {
  o = false; events = [];
  const done = commands.load.execute({hash: "", path: "/lab", search}).then(() => events.push("routing goes on"));
  await new Promise(r => setTimeout(r, 50));
  const before = [...events];
  release(); await done; await new Promise(r => setTimeout(r, 10));
  return {before_the_save: before, after: events};
}
(async () => console.log(JSON.stringify({plain: await load(""), clone: await load("clone=old")})))();
"""


def node(script: str) -> dict:
    if shutil.which("node") is None:
        pytest.skip("node is not installed (make test-idp installs it)")
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=30,
                         check=True)
    return json.loads(out.stdout)


def recents(methods: str) -> dict:
    return node(RECENTS.replace("METHODS", methods))


def load_state(command: str) -> dict:
    return node(LOAD_STATE.replace("COMMAND", command))


def test_upstream_saves_the_recent_documents_it_has_just_loaded():
    """Why the recents edit exists: upstream's load saves both lists back, unchanged."""
    assert recents(patch.RECENTS.upstream)["load"] == [2, ["a.ipynb", "b.txt"]]


def test_loading_the_recent_documents_saves_only_when_it_dropped_one():
    got = recents(patch.apply(patch.RECENTS, patch.RECENTS.upstream))
    assert got == {
        "load": [0, ["a.ipynb", "b.txt"]],  # the lists, read, and nothing saved
        "open": [1, ["d.ipynb", "a.ipynb", "b.txt"]],  # opening one saves, as before
        "load_dropping": [2, ["a.ipynb"]],  # a document gone: saved without it, as before
        "load_nothing": [0, []],
    }


def test_upstream_routing_waits_for_the_workspaces_save():
    """Why the loadState edit exists: the router goes on only once the save is done."""
    assert LOAD_STATE_COMMAND.endswith(patch.LOAD_STATE.upstream)
    got = load_state(LOAD_STATE_COMMAND)
    assert got["plain"]["before_the_save"] == ["workspace applied", "save asked"]


def test_loading_the_workspace_goes_on_before_its_save_and_a_clone_still_waits():
    got = load_state(patch.apply(patch.LOAD_STATE, LOAD_STATE_COMMAND))
    assert got["plain"] == {
        "before_the_save": ["workspace applied", "save asked", "routing goes on"],
        "after": ["workspace applied", "save asked", "routing goes on", "saved"]}
    assert got["clone"] == {  # ?clone= saves the copy before it navigates, as upstream
        "before_the_save": ["workspace applied", "save asked"],
        "after": ["workspace applied", "save asked", "saved", "navigate /lab",
                  "routing goes on"]}


@pytest.mark.parametrize("edit", patch.EDITS, ids=lambda e: e.what)
def test_each_edit_applies_once_in_the_bundle_and_marks_it(edit):
    bundle = "let x=1;" + edit.upstream + "0});"
    patched = patch.apply(edit, bundle)
    assert patched.count(edit.mark) == 1 and edit.upstream not in patched
    assert patched.startswith("let x=1;") and patched.endswith("0});")
    assert "/*MARK*/" not in patched


@pytest.mark.parametrize("edit", patch.EDITS, ids=lambda e: e.what)
@pytest.mark.parametrize("change", [lambda t: "", lambda t: t * 2,
                                    lambda t: t.replace("_.invoke()", "_.invoke( )", 1)
                                    .replace("(e,t)", "(e, t)", 1)])
def test_anything_but_upstreams_text_once_is_refused(edit, change):
    with pytest.raises(patch.DoesNotApply, match=r"found \d times \(1 expected\)"):
        patch.apply(edit, change(edit.upstream))


# A bundle with both upstream texts, once each, amid other code.
BUNDLE = "let x=1;" + patch.LOAD_STATE.upstream + "0});" + patch.RECENTS.upstream + "let y;"
NAME = "jlab_core.0123abcd.js"


def static_dir(tmp_path: Path, *bundles: str) -> Path:
    for i, text in enumerate(bundles):
        (tmp_path / (NAME if i == 0 else f"jlab_core.{i}.js")).write_text(text)
    return tmp_path


def files(static: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in static.iterdir()}


def test_the_build_writes_both_edits_to_the_bundle(tmp_path, capsys):
    static = static_dir(tmp_path, BUNDLE)
    assert patch.main(static, patch.CHECKED) == 0
    patched = (static / NAME).read_text()
    assert [patched.count(edit.mark) for edit in patch.EDITS] == [1, 1]
    assert list(files(static)) == [NAME]  # nothing staged left beside it
    assert capsys.readouterr().out.startswith(f"{NAME}: ")


@pytest.mark.parametrize("installed, bundles, reason", [
    ("4.7.0", [BUNDLE], "another version is installed"),
    ("(not installed)", [], "another version is installed"),
    # the first edit applies, the second does not: neither is written
    (patch.CHECKED, [BUNDLE.replace(patch.RECENTS.upstream, "")],
     f"the text for '{patch.RECENTS.what}' found 0 times (1 expected)"),
    (patch.CHECKED, [BUNDLE + patch.RECENTS.upstream],
     f"the text for '{patch.RECENTS.what}' found 2 times (1 expected)"),
    (patch.CHECKED, [patch.apply(patch.LOAD_STATE, BUNDLE)],  # already patched
     f"the text for '{patch.LOAD_STATE.what}' found 0 times (1 expected)"),
    (patch.CHECKED, [], "0 jlab_core bundles in"),
    (patch.CHECKED, [BUNDLE, BUNDLE], "2 jlab_core bundles in"),
], ids=["other version", "no jupyterlab", "a text missing", "a text twice", "patched already",
        "no bundle", "two bundles"])
def test_otherwise_the_build_goes_on_with_the_bundle_untouched_and_a_warning(
        tmp_path, capsys, installed, bundles, reason):
    """The edits only save time at sign-in: not worth a failed image build."""
    static = static_dir(tmp_path, *bundles)
    before = files(static)
    assert patch.main(static, installed) == 0
    assert files(static) == before
    err = capsys.readouterr().err
    assert err.startswith("WARNING: patch_jupyterlab_load.py: JupyterLab's bundle left as it "
                          f"is, {reason}")
    assert (f"derived from JupyterLab {patch.CHECKED}, found JupyterLab {installed}). "
            "Sign-in will be ~1 s slower") in err
    assert "until the edits are re-derived" in err


def test_the_image_pins_the_jupyterlab_the_edits_were_derived_from():
    """The build only warns on another JupyterLab: this is where the team hears of it."""
    locks = sorted(IMAGE.glob("requirements-*.lock"))
    pins = {lock.name: re.search(r"^jupyterlab===?([^\s\\]+)", lock.read_text(), re.M)
            for lock in locks}
    assert locks and all(pins.values()), f"no jupyterlab pin found in {list(pins)}"
    other = [f"{pin.group(1)} ({name})" for name, pin in pins.items()
             if pin.group(1) != patch.CHECKED]
    assert not other, (
        f"the single-user image pins JupyterLab {', '.join(other)}, and the edits in {SCRIPT.name} "
        f"were derived from JupyterLab {patch.CHECKED}: re-derive the edits (both texts in "
        f"the new jlab_core bundle, then CHECKED) or drop the patch (the file, its lines in "
        f"images/singleuser/Dockerfile and its note in gpulab.compat). Until then sign-in "
        f"is ~1 s slower.")
