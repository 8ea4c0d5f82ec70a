"""Images copied from one dockerd's data root into another's, as hard links where both
are on one mount, without ``docker save`` and ``docker load``.

Both engines use the overlay2 storage driver on one filesystem. An image is its config
(``image/overlay2/imagedb``), its layers (``image/overlay2/layerdb/sha256/<chain ID>``,
each naming its directory ``overlay2/<cache ID>`` and that directory's short name in
``overlay2/l``) and its tags (``image/overlay2/repositories.json``). overlay2 never writes
to a committed layer (a container's changes go to its own upper directory) and removing
an image unlinks the names of the engine that removes it, so the copies share the files
safely, as the harness's machines already share their manager's (``cp -al``). The
source engine may keep running: only committed layers are read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

STORE = Path("image") / "overlay2"


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The chain ID of each layer of an image whose layers have *diff_ids* (the OCI image
    spec's ChainID: the first diff ID, then sha256 of "<parent chain> <diff ID>")."""
    chains: list[str] = []
    for diff in diff_ids:
        chain = diff if not chains else \
            "sha256:" + hashlib.sha256(f"{chains[-1]} {diff}".encode()).hexdigest()
        chains.append(chain)
    return chains


def can_link(src_root: Path, dest_root: Path) -> bool:
    """Can files of *src_root* be hard-linked into *dest_root*? Not across mounts, even
    of one filesystem (a bind-mounted /var/lib/docker here)."""
    probe = dest_root / ".gpulab-link-probe"
    try:
        os.link(src_root / STORE / "repositories.json", probe)
    except OSError:
        return False
    probe.unlink()
    return True


def _copy_tree(src: Path, dest: Path, hard_links: bool) -> None:
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-al" if hard_links else "-a", str(src), str(dest)],
                       check=True, timeout=300, capture_output=True)


def copy_images(src_root: Path, dest_root: Path, tags: dict[str, str],
                hard_links: bool = True) -> None:
    """Give the engine whose data root is *dest_root* (not running) the images *tags*
    names (tag -> image ID "sha256:...") from the engine at *src_root*: their files as
    hard links, or copied where *hard_links* is false (see can_link)."""
    src, dest = src_root / STORE, dest_root / STORE
    (dest_root / "overlay2" / "l").mkdir(parents=True, exist_ok=True)
    for image_id in set(tags.values()):
        hex_id = image_id.removeprefix("sha256:")
        config = src / "imagedb" / "content" / "sha256" / hex_id
        diff_ids = json.loads(config.read_text())["rootfs"]["diff_ids"]
        for chain in chain_ids(diff_ids):
            layer = src / "layerdb" / "sha256" / chain.removeprefix("sha256:")
            cache_id = (layer / "cache-id").read_text().strip()
            _copy_tree(layer, dest / "layerdb" / "sha256" / layer.name, hard_links)
            _copy_tree(src_root / "overlay2" / cache_id, dest_root / "overlay2" / cache_id,
                       hard_links)
            short = (src_root / "overlay2" / cache_id / "link").read_text().strip()
            link = dest_root / "overlay2" / "l" / short
            if not link.is_symlink():
                os.symlink(f"../{cache_id}/diff", link)
        content = dest / "imagedb" / "content" / "sha256"
        content.mkdir(parents=True, exist_ok=True)
        shutil.copy2(config, content / hex_id)
        metadata = src / "imagedb" / "metadata" / "sha256" / hex_id
        if metadata.is_dir():
            _copy_tree(metadata, dest / "imagedb" / "metadata" / "sha256" / hex_id,
                       hard_links)
    repositories = dest / "repositories.json"
    known = json.loads(repositories.read_text()) if repositories.exists() else {}
    repos = known.setdefault("Repositories", {})
    for tag, image_id in tags.items():
        repos.setdefault(tag.rpartition(":")[0], {})[tag] = image_id
    repositories.write_text(json.dumps(known))


def main(argv: list[str]) -> int:
    """python -m tests.swarm.image_store SRC-ROOT DEST-ROOT TAGS-JSON INODE: copy_images
    as hard links, run by the harness in a mount namespace of its own where SRC-ROOT is
    not a mount point (its files then on the same mount as DEST-ROOT). INODE: that of
    SRC-ROOT's repositories.json as the caller sees it, so that only the very same files
    are linked. Exit 3 when they are not, or cannot be linked."""
    src, dest, tags, inode = Path(argv[0]), Path(argv[1]), json.loads(argv[2]), int(argv[3])
    try:
        same = (src / STORE / "repositories.json").stat().st_ino == inode
    except OSError:
        same = False
    if not same or not can_link(src, dest):
        return 3
    copy_images(src, dest, tags)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
