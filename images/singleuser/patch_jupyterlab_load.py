"""JupyterLab shows its launcher without first waiting on its own workspace saves: two
edits to JupyterLab's built scripts, made at the image's build when JupyterLab is the
version they were checked against (otherwise a warning, and the scripts as they are).

Measured in Chromium on the 2-core test machine (bench/member.py): of the ~4.4 s from
"Sign in" to a usable JupyterLab, about 1 s was JupyterLab waiting, with nothing to do,
on two 500 ms timers (Chrome traces; the debugger's async stacks named the callers):

* The launcher and the file browser wait for the router, and the router for
  ``@jupyterlab/apputils-extension``'s ``loadState`` command, which ends by awaiting the
  workspace's save debouncer: 500 ms after the state database last changed (every
  restored panel changes it). The workspace is already read and applied by then; the
  save only writes it back. Edit: the command asks for the save and returns (the save
  still happens 500 ms later). The clone path (``?clone``), which must save before it
  navigates, is left as it is.
* ``RecentsManager._loadRecents`` (``@jupyterlab/docmanager``) writes back the lists of
  recent documents it has just read, through its own 500 ms debouncer, which landed
  inside that wait and restarted it (+~0.45 s). Edit: loading saves the lists only when it
  dropped documents that no longer exist, as upstream always did; opening, closing and
  clearing save as before.

What upstream could do: the same two changes (not reported upstream from here;
gpulab.compat lists them with gpulab's other uses of upstream internals). The texts
below are JupyterLab 4.6.6's minified ``jlab_core`` bundle, matched whole. The edits
only save time, so on another JupyterLab, or a text not found, the build goes on with
the bundle untouched (both edits or neither) and a warning; the unit tests fail when the
image's lock pins another JupyterLab. Then check both places upstream again, and adjust
the texts and ``CHECKED`` (or drop this file).
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

CHECKED = "4.6.6"
STATIC = Path(sys.prefix) / "share" / "jupyter" / "lab" / "static"


@dataclass(frozen=True)
class Edit:
    what: str
    upstream: str
    patched: str

    @property
    def mark(self) -> str:
        return f"/*gpulab: {self.what}*/"


LOAD_STATE = Edit(
    "loading the workspace does not wait for its save",
    "r.then(()=>{i.navigate(e)}),r}await _.invoke()}}),a.addCommand(h.reset,",
    "r.then(()=>{i.navigate(e)}),r}/*MARK*/void _.invoke()}}),a.addCommand(h.reset,")

RECENTS = Edit(
    "loading the recent documents saves nothing",
    "_setRecents(e,t){this._recents[t]=e.slice(0,this.maximalRecentsLength).sort((e,t)=>"
    "e.root===t.root?0:e.root!==this._serverRoot?1:-1),this._saveDebouncer.invoke()"
    ".catch(console.warn)}async _loadRecents(){let e=await this._stateDB.fetch("
    "o.stateDBKey)||{opened:[],closed:[]},t=[...e.opened,...e.closed],i=new Set(await "
    "this._getInvalidPaths(t));for(let t of[\"opened\",\"closed\"])this._setRecents("
    "e[t].filter(e=>!i.has(e.path)),t);this._recentsChanged.emit(void 0)}",
    "_setRecents(e,t,n=!0){this._recents[t]=e.slice(0,this.maximalRecentsLength).sort("
    "(e,t)=>e.root===t.root?0:e.root!==this._serverRoot?1:-1),n&&this._saveDebouncer"
    ".invoke().catch(console.warn)}async _loadRecents(){/*MARK*/let e=await "
    "this._stateDB.fetch(o.stateDBKey)||{opened:[],closed:[]},t=[...e.opened,...e.closed],"
    "i=new Set(await this._getInvalidPaths(t));for(let t of[\"opened\",\"closed\"])"
    "this._setRecents(e[t].filter(e=>!i.has(e.path)),t,i.size>0);"
    "this._recentsChanged.emit(void 0)}")

EDITS = (LOAD_STATE, RECENTS)


class DoesNotApply(Exception):
    pass


def apply(edit: Edit, bundle: str) -> str:
    """*bundle* with *edit* made; DoesNotApply unless its upstream text is there once."""
    found = bundle.count(edit.upstream)
    if found != 1:
        raise DoesNotApply(f"the text for '{edit.what}' found {found} times (1 expected)")
    return bundle.replace(edit.upstream, edit.patched.replace("/*MARK*/", edit.mark))


def patch_bundle(static: Path, installed: str) -> str:
    """Both edits made to the one ``jlab_core`` bundle in *static*, written in one
    replace (never one edit without the other); its name. DoesNotApply, with the bundle
    untouched, unless *installed* is ``CHECKED`` and both texts are found."""
    if installed != CHECKED:
        raise DoesNotApply("another version is installed")
    bundles = sorted(static.glob("jlab_core.*.js"))
    if len(bundles) != 1:
        raise DoesNotApply(f"{len(bundles)} jlab_core bundles in {static} (1 expected)")
    text = bundles[0].read_text()
    for edit in EDITS:
        text = apply(edit, text)
    staged = bundles[0].with_name(bundles[0].name + ".gpulab")
    staged.write_text(text)
    shutil.copymode(bundles[0], staged)
    os.replace(staged, bundles[0])
    return bundles[0].name


def installed_jupyterlab() -> str:
    try:
        return version("jupyterlab")
    except PackageNotFoundError:
        return "(not installed)"


def main(static: Path = STATIC, installed: str | None = None) -> int:
    """0 whether or not the edits apply: they only save time at sign-in."""
    installed = installed or installed_jupyterlab()
    try:
        name = patch_bundle(static, installed)
    except DoesNotApply as e:
        print(f"WARNING: {Path(__file__).name}: JupyterLab's bundle left as it is, {e} "
              f"(the edits were derived from JupyterLab {CHECKED}, found JupyterLab "
              f"{installed}). Sign-in will be ~1 s slower (JupyterLab waits on its own "
              f"workspace saves) until the edits are re-derived for this JupyterLab (see "
              f"the file's docstring) or the file is dropped.", file=sys.stderr)
        return 0
    print(f"{name}: " + "; ".join(edit.what for edit in EDITS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
