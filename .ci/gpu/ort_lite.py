"""Packs onnxruntime-gpu small enough for one device call (64 MiB with the checkout): the wheel's
onnxruntime package without its TensorRT provider, C-API library and tooling, its CUDA provider's
fatbinary cut to what a CNN on an H200 runs. In that provider every fatbin container holds one
translation unit's kernels for each architecture; this keeps the sm_90 SASS of every container except
those whose kernels all belong to transformer and LLM operators (attention, MoE, beam search, 4-bit
MatMul...), and zeroes every other payload in place (the file keeps its size and layout; zeros
compress to nothing). CUDA loads modules lazily, so a zeroed module is only ever read if one of its
kernels runs, which fails loudly (no kernel image) instead of computing anything wrong.

    python3 ort_lite.py WHEEL OUT.tar.xz        (needs the zstandard package: the payloads are zstd)
"""
import io
import re
import struct
import sys
import tarfile
import zipfile

import zstandard

MAGIC = struct.pack("<I", 0xBA55ED50)
ARCH = 90
TRANSFORMER_ONLY = re.compile(rb"flash|fmha|ttention|moe|BeamSearch|beam_search|Sampling|otary|NBits|nbits|"
                              rb"blockwise|QOrdered|qordered|xqa|DecoderMasked|decoder_masked|fpA_intB|cutlass|"
                              rb"GroupQuery|Paged|KVCache|kv_cache|int4|fp8|fp4|GatedRelative|mamba|gated_delta",
                              re.I)
CORE = re.compile(rb"^_ZN11onnxruntime4cuda|^_ZN3cub|^_ZN6thrust")
DROP = re.compile(r"onnxruntime/(capi/libonnxruntime_providers_tensorrt\.so|capi/libonnxruntime\.so\.[0-9.]+|"
                  r"transformers/|tools/|quantization/|datasets/|backend/)")


def _entries(buf: bytearray, off: int):
    _, version, header, size = struct.unpack_from("<IHHQ", buf, off)
    if version != 1 or header != 16 or not 0 < size <= len(buf) - off - 16:
        return None
    entries, e, end = [], off + 16, off + 16 + size
    while e < end:
        kind, _, eh, esize = struct.unpack_from("<HHIQ", buf, e)
        if kind not in (1, 2) or eh < 64 or e + eh + esize > end:
            return None
        arch, raw = struct.unpack_from("<I", buf, e + 28)[0], struct.unpack_from("<Q", buf, e + 56)[0]
        entries.append((kind, arch, e + eh, esize, raw))
        e += eh + esize
    return entries, end


def _kernel_names(payload: bytes, raw_size: int) -> list[bytes]:
    if payload[:4] == b"\x28\xb5\x2f\xfd":
        payload = zstandard.ZstdDecompressor().decompress(payload, max_output_size=max(raw_size, 1 << 26))
    return re.findall(rb"\.text\.([A-Za-z0-9_]+)", payload)


def prune(buf: bytearray) -> tuple[int, int]:
    """Zeroes payloads in place; returns (bytes kept, bytes zeroed)."""
    kept = zeroed = 0
    off = buf.find(MAGIC)
    while off >= 0:
        found = _entries(buf, off)
        if found is None:
            off = buf.find(MAGIC, off + 4)
            continue
        entries, end = found
        sass = [(p, s, raw) for kind, arch, p, s, raw in entries if kind == 2 and arch == ARCH]
        unused = False
        if sass:
            names = _kernel_names(bytes(buf[sass[0][0]:sass[0][0] + sass[0][1]]), sass[0][2])
            unused = bool(names) and all(TRANSFORMER_ONLY.search(n) and not CORE.match(n) for n in names)
        for kind, arch, p, s, _ in entries:
            if sass and (unused or not (kind == 2 and arch == ARCH)):
                buf[p:p + s] = bytes(s)
                zeroed += s
            else:
                kept += s
        off = buf.find(MAGIC, end)
    return kept, zeroed


def main(wheel: str, out: str) -> None:
    with zipfile.ZipFile(wheel) as z, tarfile.open(out, "w:xz", preset=6) as tar:
        for info in z.infolist():
            top = info.filename.split("/")[0]
            if not (top == "onnxruntime" or top.endswith(".dist-info")) or DROP.match(info.filename) or info.is_dir():
                continue
            data = z.read(info)
            if info.filename.endswith("libonnxruntime_providers_cuda.so"):
                buf = bytearray(data)
                kept, zeroed = prune(buf)
                print(f"CUDA provider: {kept / 1e6:.1f} MB of device code kept, {zeroed / 1e6:.1f} MB zeroed")
                data = bytes(buf)
            t = tarfile.TarInfo(info.filename)
            t.size, t.mode = len(data), 0o755 if info.filename.endswith(".so") else 0o644
            tar.addfile(t, io.BytesIO(data))


if __name__ == "__main__":
    main(*sys.argv[1:])
