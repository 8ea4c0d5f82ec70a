"""Small pure-Python wheels made the way the wheel spec says, for tests that install
packages with a real pip (a member's %pip install, the images' lock files)."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from pathlib import Path


def wheel_bytes(name: str, version: str, files: dict[str, str],
                requires: tuple[str, ...] = ()) -> bytes:
    """A py3-none-any wheel of *name* *version* holding *files* (path -> text), whose
    metadata requires *requires*."""
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {**files, f"{dist}/METADATA": metadata,
             f"{dist}/WHEEL": ("Wheel-Version: 1.0\nGenerator: gpulab-tests\n"
                               "Root-Is-Purelib: true\nTag: py3-none-any\n")}
    record = []
    for path, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(data)}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return buffer.getvalue()


def wheel_name(name: str, version: str) -> str:
    return f"{name.replace('-', '_')}-{version}-py3-none-any.whl"


def write_wheel(folder: Path, name: str, version: str, files: dict[str, str] | None = None,
                requires: tuple[str, ...] = ()) -> Path:
    """*name* *version* as a wheel file in *folder*; its module holds VERSION."""
    module = name.replace("-", "_")
    files = files if files is not None else {f"{module}/__init__.py": f"VERSION = {version!r}\n"}
    path = folder / wheel_name(name, version)
    path.write_bytes(wheel_bytes(name, version, files, requires))
    return path
