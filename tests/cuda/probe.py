"""Run INSIDE the CUDA single-user image (by tests/cuda/test_cuda_image.py) on a host with
or without a GPU: what its torch was built with and which of NVIDIA's libraries load, as
JSON on stdout. Only the standard library and torch."""

import ctypes
import glob
import importlib.metadata as metadata
import json
import os
import sys


def version_of(dist: str):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cublas_version():
    """cuBLAS' own version (cublasGetProperty needs no GPU), from the library torch uses."""
    import nvidia.cu13  # noqa: F401  (the CUDA 13 wheels' namespace)

    found = sorted(glob.glob(os.path.join(sys.modules["nvidia.cu13"].__path__[0],
                                          "lib", "libcublas.so.*")))
    lib = ctypes.CDLL(found[0])
    parts = []
    for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        value = ctypes.c_int()
        status = lib.cublasGetProperty(prop, ctypes.byref(value))
        if status != 0:
            raise RuntimeError(f"cublasGetProperty({prop}) returned {status}")
        parts.append(value.value)
    return {"library": os.path.basename(found[0]), "version": ".".join(map(str, parts))}


def main():
    import torch

    report = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
              "cuda_available": torch.cuda.is_available()}
    try:
        torch.cuda.init()
        report["cuda_init"] = "ok"
    except Exception as e:  # the reason a member's GPU panel gives on a host without GPU
        report["cuda_init"] = f"{type(e).__name__}: {e}"
    for key, call in (("cudnn", torch.backends.cudnn.version),
                      ("nccl", lambda: ".".join(map(str, torch.cuda.nccl.version()))),
                      ("cublas", cublas_version)):
        try:
            report[key] = call()
        except Exception as e:
            report[key] = f"FAILED {type(e).__name__}: {e}"
    report["wheels"] = {d: version_of(d) for d in (
        "nvidia-cuda-runtime", "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cublas",
        "cuda-toolkit")}
    print(json.dumps(report))


main()
