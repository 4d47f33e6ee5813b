"""The CUDA program of the namespace check: what it sees in ``/dev``, how many GPUs CUDA finds,
the UUID of the first, and whether a kernel on it computes the right answer — one JSON line.

Runs under whichever Python has a CUDA runtime (torch, cupy or cuda-python), so it imports
nothing of ours and keeps to Python 3.8. ``--which`` only names the runtime it would use (empty
when none imports) and touches no GPU.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

N = 1 << 20  # elements; the kernel writes 2*i at i, the host checks the sum
EXPECTED = N * (N - 1)
RUNTIMES = ("torch", "cupy", "cuda-python")
PTX = b"""
.version 7.0
.target sm_50
.address_size 64

.visible .entry twice(.param .u64 twice_out, .param .u32 twice_n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<7>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [twice_out];
    ld.param.u32 %r1, [twice_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    shl.b32 %r6, %r5, 1;
    st.global.u32 [%rd4], %r6;
DONE:
    ret;
}
"""


def available() -> str:
    for name in RUNTIMES:
        try:
            if name == "cuda-python":
                _cuda_driver()
            elif name == "torch":
                import torch

                if torch.version.cuda is None:  # a CPU-only (or ROCm) build
                    continue
            else:
                __import__(name)
        except Exception:  # an import that fails in any way: not this runtime
            continue
        return name
    return ""


def _cuda_driver():  # type: ignore[no-untyped-def]
    try:
        from cuda.bindings import driver
    except ImportError:
        from cuda import cuda as driver  # cuda-python before 12.6
    return driver


def with_torch() -> dict[str, object]:
    import torch

    count = torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    x = torch.arange(N, device="cuda:0", dtype=torch.int64)
    total = int((x * 2).sum().item())
    torch.cuda.synchronize()
    return {"count": count, "uuid": str(getattr(props, "uuid", "")), "sum": total}


def with_cupy() -> dict[str, object]:
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    raw = cupy.cuda.runtime.getDeviceProperties(0).get("uuid", b"")
    x = cupy.arange(N, dtype=cupy.int64)
    total = int((x * 2).sum())
    cupy.cuda.runtime.deviceSynchronize()
    uuid = raw.hex() if isinstance(raw, bytes) else str(raw)
    return {"count": count, "uuid": uuid, "sum": total}


def with_cuda_python() -> dict[str, object]:
    cu = _cuda_driver()

    def check(result):  # type: ignore[no-untyped-def]
        result = result if isinstance(result, tuple) else (result,)
        err, rest = result[0], result[1:]
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA driver call failed: {err}")
        return rest[0] if len(rest) == 1 else rest

    check(cu.cuInit(0))
    count = check(cu.cuDeviceGetCount())
    device = check(cu.cuDeviceGet(0))
    get_uuid = getattr(cu, "cuDeviceGetUuid_v2", None) or cu.cuDeviceGetUuid
    uuid = bytes(check(get_uuid(device)).bytes).hex()
    context = check(cu.cuDevicePrimaryCtxRetain(device))
    check(cu.cuCtxSetCurrent(context))
    image = ctypes.create_string_buffer(PTX)  # NUL-terminated, as the driver reads PTX
    module = check(cu.cuModuleLoadData(ctypes.addressof(image)))
    kernel = check(cu.cuModuleGetFunction(module, b"twice"))
    memory = check(cu.cuMemAlloc(N * 4))
    out, n = ctypes.c_uint64(int(memory)), ctypes.c_uint32(N)
    params = (ctypes.c_void_p * 2)(ctypes.addressof(out), ctypes.addressof(n))
    threads = 256
    check(
        cu.cuLaunchKernel(
            kernel, N // threads, 1, 1, threads, 1, 1, 0, 0, ctypes.addressof(params), 0
        )
    )
    check(cu.cuCtxSynchronize())
    host = (ctypes.c_uint32 * N)()
    check(cu.cuMemcpyDtoH(ctypes.addressof(host), memory, N * 4))
    check(cu.cuMemFree(memory))
    check(cu.cuModuleUnload(module))
    check(cu.cuDevicePrimaryCtxRelease(device))
    return {"count": count, "uuid": uuid, "sum": sum(host)}


def dev_entries() -> list[str]:
    """Every non-directory under ``/dev``, relative to it."""
    found = []
    for root, _dirs, files in os.walk("/dev"):
        for name in files:
            found.append(os.path.relpath(os.path.join(root, name), "/dev"))
    return sorted(found)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--which"]:
        print(available())
        return 0
    runtime = argv[0] if argv else available()
    report: dict[str, object] = {"runtime": runtime, "dev": dev_entries()}  # before CUDA runs
    run = {"torch": with_torch, "cupy": with_cupy, "cuda-python": with_cuda_python}[runtime]
    report.update(run())
    report["expected"] = EXPECTED
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
