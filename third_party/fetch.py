#!/usr/bin/env python3
"""Fetch the pinned CUDA toolchain and CUTLASS headers from PyPI into a folder outside the source.

Usage: fetch.py DEST. build.rs passes `<cache>/toolchain/<hash of pins.txt>`, so the crate's
source folder is never written (a registry download is read-only, and docs.rs has no network).
Reads pins.txt beside this script (name, version, sha256), downloads each wheel with pip into
`<cache>/wheels`, verifies its sha256, and unpacks:
  DEST/cuda/nvidia/cu13/{bin,include,lib,nvvm}   nvcc 13.0, cudart, cuobjdump, nvdisasm
  DEST/cutlass/{include,tools,examples}           CUTLASS 4.2.0 (cutlass_library/source)
  DEST/libclang/libclang.so                       libclang 18, for bindgen in build.rs
DEST appears whole or not at all (unpacked beside it, then renamed), so concurrent builds and an
interrupted one never see half a toolchain; a second run finds it and does nothing. Its temporary
folders are named bsg-fetch-*, which build.rs removes once a killed run left them a day ago.
Standard library only.
"""
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PINS = os.path.join(HERE, "pins.txt")
PLATFORMS = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_12_x86_64",
             "manylinux2010_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64"]


def wheel_cache():
    base = os.environ.get("BSG_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "blockscaled-gemm")
    path = os.path.join(base, "wheels")
    os.makedirs(path, exist_ok=True)
    return path


def read_pins():
    pins = []
    with open(PINS) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                name, version, sha = line.split()
                pins.append((name, version, sha))
    return pins


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def find_wheel(cache, name, version, sha):
    prefix = name.replace("-", "_") + "-" + version + "-"
    for fn in sorted(os.listdir(cache)):
        if fn.startswith(prefix) and fn.endswith(".whl"):
            path = os.path.join(cache, fn)
            if sha256(path) == sha:
                return path
            # Another pin's wheel of the same name and version (another platform's, say), which
            # a build of another pin may be using: never remove it. A wheel only ever appears
            # here whole (renamed from pip's own folder), so it is not a partial one.
    return None


def download(cache, name, version, sha):
    path = find_wheel(cache, name, version, sha)
    if path:
        return path
    # pip writes into a folder of this process's own; the checked wheel then appears in the cache
    # by one rename, so a concurrent build never finds (and deletes) a wheel still being written.
    with tempfile.TemporaryDirectory(prefix="bsg-fetch-", dir=cache) as part:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--only-binary=:all:", "--python-version", "3.11", "-d", part,
               f"{name}=={version}"]
        for p in PLATFORMS:
            cmd += ["--platform", p]
        print(f"fetch.py: downloading {name}=={version}", file=sys.stderr)
        subprocess.run(cmd, check=True)
        got = find_wheel(part, name, version, sha)
        if got:
            os.replace(got, os.path.join(cache, os.path.basename(got)))
    path = find_wheel(cache, name, version, sha)
    if not path:
        sys.exit(f"fetch.py: {name}=={version}: no wheel with sha256 {sha} (checksum mismatch?)")
    return path


def extract(whl, dest):
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            out = z.extract(info, dest)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(out, mode)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: fetch.py DEST (build.rs passes <cache>/toolchain/<hash of pins.txt>)")
    dest = os.path.abspath(sys.argv[1])
    if os.path.isdir(dest):
        return
    pins = read_pins()
    cache = wheel_cache()
    wheels = [(n, download(cache, n, v, s)) for n, v, s in pins]
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bsg-fetch-", dir=parent) as tmp:
        unpacked, staged = os.path.join(tmp, "wheels"), os.path.join(tmp, "toolchain")
        for name, whl in wheels:
            extract(whl, unpacked)
        os.makedirs(staged)
        shutil.move(os.path.join(unpacked, "nvidia"), os.path.join(staged, "cuda", "nvidia"))
        shutil.move(os.path.join(unpacked, "cutlass_library", "source"), os.path.join(staged, "cutlass"))
        clang = [d for d in os.listdir(unpacked) if d.startswith("libclang-") and d.endswith(".data")]
        if clang:
            shutil.move(os.path.join(unpacked, clang[0], "platlib", "clang", "native"), os.path.join(staged, "libclang"))
        for d in ("bin", "nvvm/bin"):  # some wheels do not record the executable bit
            for root, _, files in os.walk(os.path.join(staged, "cuda", "nvidia", "cu13", d)):
                for f in files:
                    p = os.path.join(root, f)
                    os.chmod(p, os.stat(p).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        try:
            os.rename(staged, dest)
        except OSError:
            if not os.path.isdir(dest):  # else a concurrent build finished first: use its copy
                raise
    print(f"fetch.py: toolchain ready in {dest}", file=sys.stderr)


if __name__ == "__main__":
    main()
