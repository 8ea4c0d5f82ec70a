"""JupyterLab shows its launcher without first waiting on its own workspace saves: two
edits to JupyterLab's built scripts, made at the image's build, which stops when
JupyterLab is not the version they were checked against.

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
below are JupyterLab 4.6.6's minified ``jlab_core`` bundle, matched whole: any change
there stops the build. Then check both places upstream again, and adjust the texts and
``CHECKED``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib.metadata import version
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


def main() -> int:
    installed = version("jupyterlab")
    bundles = sorted(STATIC.glob("jlab_core.*.js"))
    try:
        if installed != CHECKED:
            raise DoesNotApply(f"JupyterLab {installed} is installed, the edits were checked "
                               f"against {CHECKED}")
        if len(bundles) != 1:
            raise DoesNotApply(f"{len(bundles)} jlab_core bundles in {STATIC} (1 expected)")
        bundle = bundles[0].read_text()
        for edit in EDITS:
            bundle = apply(edit, bundle)
        bundles[0].write_text(bundle)
    except DoesNotApply as e:
        print(f"{__file__}: {e}. Check JupyterLab upstream again, then adjust this file "
              f"(see its docstring).", file=sys.stderr)
        return 1
    print(f"{bundles[0].name}: " + "; ".join(edit.what for edit in EDITS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
