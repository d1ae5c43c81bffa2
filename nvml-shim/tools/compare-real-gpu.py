#!/usr/bin/env python3
"""Compare the shim's MIG model with a real MIG-capable GPU. READ-ONLY.

On a machine with a real GPU (A100-40GB, A100-80GB, H100-80GB or H200-141GB) and the NVIDIA
driver, this prints the real GPU instance profile table and possible placements (through
NVIDIA's nvidia-ml-py against the real libnvidia-ml.so.1) next to the shim's model of the same
GPU model (queried through the same bindings in a subprocess loaded with the shim), and flags
every difference. Exit status 0: no difference, 1: differences, 2: usage/setup error.

It only calls query functions (nvmlDeviceGet*, nvmlGpuInstanceGet*): it never creates or
destroys GPU/compute instances and never changes the MIG mode. Compute instance profiles are
compared only for GPU instances that already exist on the real GPU.

    pip install nvidia-ml-py==13.590.48
    cargo build -p nvml-shim --release
    python3 nvml-shim/tools/compare-real-gpu.py [--gpu 0] [--shim-lib target/release/libnvidia_ml.so]
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile

FIELDS = ["id", "sliceCount", "instanceCount", "multiprocessorCount", "copyEngineCount",
          "decoderCount", "encoderCount", "jpegCount", "ofaCount", "memorySizeMB", "name"]
CI_FIELDS = ["id", "sliceCount", "instanceCount", "multiprocessorCount", "sharedCopyEngineCount",
             "sharedDecoderCount", "sharedEncoderCount", "sharedJpegCount", "sharedOfaCount", "name"]
MODELS = {"A100-SXM4-40GB": "A100-40GB", "A100-PCIE-40GB": "A100-40GB",
          "A100-SXM4-80GB": "A100-80GB", "A100-PCIE-80GB": "A100-80GB", "A100 80GB PCIe": "A100-80GB",
          "H100 80GB HBM3": "H100-80GB", "H100 PCIe": "H100-80GB", "H100-SXM5-80GB": "H100-80GB",
          "H200": "H200-141GB", "H200 NVL": "H200-141GB"}


def dump(lib, gpu):
    """Runs in a subprocess: every query result for GPU `gpu`, as JSON on stdout."""
    import pynvml as N
    if lib:
        N.nvmlLib = ctypes.CDLL(lib)
    N.nvmlInit()
    dev = N.nvmlDeviceGetHandleByIndex(gpu)
    out = {"name": N.nvmlDeviceGetName(dev), "memory_total": N.nvmlDeviceGetMemoryInfo(dev).total}
    try:
        out["mig_mode"] = N.nvmlDeviceGetMigMode(dev)
    except N.NVMLError as e:
        out["mig_mode"] = str(e)
    profiles = {}
    for idx in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = N.nvmlDeviceGetGpuInstanceProfileInfo(dev, idx)
        except N.NVMLError as e:
            profiles[idx] = {"error": type(e).__name__}
            continue
        row = {f: getattr(info, f) for f in FIELDS}
        try:
            count = ctypes.c_uint(0)
            N.nvmlDeviceGetGpuInstancePossiblePlacements(dev, info.id, None, ctypes.byref(count))
            arr = (N.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
            N.nvmlDeviceGetGpuInstancePossiblePlacements(dev, info.id, arr, ctypes.byref(count))
            row["placements"] = [[p.start, p.size] for p in arr[: count.value]]
        except N.NVMLError as e:
            row["placements"] = type(e).__name__
        profiles[idx] = row
    out["gi_profiles"] = profiles
    # Compute instance profiles of GIs that already exist (read-only listing).
    cis = {}
    if isinstance(out["mig_mode"], list) and out["mig_mode"][0] == 1:
        for row in profiles.values():
            if "error" in row:
                continue
            arr = (N.c_nvmlGpuInstance_t * row["instanceCount"])()
            n = ctypes.c_uint(0)
            try:
                N.nvmlDeviceGetGpuInstances(dev, row["id"], arr, ctypes.byref(n))
            except N.NVMLError:
                continue
            if n.value == 0 or row["id"] in cis:
                continue
            gi = arr[0]
            per = {}
            for cidx in range(N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                try:
                    ci = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, cidx, 0)
                    per[cidx] = {f: getattr(ci, f) for f in CI_FIELDS}
                except N.NVMLError as e:
                    per[cidx] = {"error": type(e).__name__}
            cis[row["id"]] = per
    out["ci_profiles"] = cis
    N.nvmlShutdown()
    print(json.dumps(out))


def run_dump(lib, gpu, env=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--dump", "--gpu", str(gpu)]
    if lib:
        cmd += ["--lib", lib]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"query through {lib or 'libnvidia-ml.so.1'} failed:\n{r.stderr}")
    return json.loads(r.stdout)


def shim_dump_for(model, shim_lib, existing_gi_profiles, tmp):
    """The shim's view of one GPU of `model`; GIs are created only in the shim's temp state."""
    fixture = os.path.join(tmp, "fixture.toml")
    with open(fixture, "w") as f:
        f.write(f'state = "state.json"\n[[gpus]]\nmodel = "{model}"\nmig_mode = true\n')
    env = dict(os.environ, NVML_SHIM_FIXTURE=fixture)
    env.pop("NVML_SHIM_STATE", None)
    env.pop("NVML_SHIM_FAULTS", None)
    out = run_dump(shim_lib, 0, env)
    if existing_gi_profiles:
        # Ask the shim for CI profiles of the same GI profiles: create them in the shim's own
        # temporary state (never on the real GPU), one at a time.
        out["ci_profiles"] = {}
        ctl_env = env
        for pid in existing_gi_profiles:
            code = (
                "import ctypes, pynvml as N, json, sys\n"
                f"N.nvmlLib = ctypes.CDLL({shim_lib!r}); N.nvmlInit()\n"
                "d = N.nvmlDeviceGetHandleByIndex(0)\n"
                f"gi = N.nvmlDeviceCreateGpuInstance(d, {int(pid)})\n"
                "per = {}\n"
                "for c in range(N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):\n"
                "    try:\n"
                "        ci = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, c, 0)\n"
                f"        per[c] = {{f: getattr(ci, f) for f in {CI_FIELDS!r}}}\n"
                "    except N.NVMLError as e:\n"
                "        per[c] = {'error': type(e).__name__}\n"
                "N.nvmlGpuInstanceDestroy(gi); N.nvmlShutdown(); print(json.dumps(per))\n")
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ctl_env)
            if r.returncode != 0:
                raise SystemExit(f"shim CI query failed:\n{r.stderr}")
            out["ci_profiles"][str(pid)] = json.loads(r.stdout)
    return out


def compare(real, shim):
    diffs = []
    print(f"real GPU: {real['name']}  memory {real['memory_total'] >> 20} MiB  mig {real['mig_mode']}")
    print(f"shim    : {shim['name']}  memory {shim['memory_total'] >> 20} MiB")
    if real["memory_total"] != shim["memory_total"]:
        diffs.append(f"memory total: real {real['memory_total']} shim {shim['memory_total']}")
    print(f"\n{'idx':>3} {'field':<20} {'real':<40} {'shim':<40}")
    for idx in sorted(set(real["gi_profiles"]) | set(shim["gi_profiles"]), key=int):
        r = real["gi_profiles"].get(idx, {"error": "absent"})
        s = shim["gi_profiles"].get(idx, {"error": "absent"})
        for f in sorted(set(r) | set(s), key=lambda k: (k not in FIELDS, FIELDS.index(k) if k in FIELDS else 0, k)):
            rv, sv = r.get(f), s.get(f)
            flag = "" if rv == sv else "   <-- DIFFERS"
            if flag:
                diffs.append(f"GI profile index {idx} {f}: real {rv!r} shim {sv!r}")
            print(f"{idx:>3} {f:<20} {str(rv):<40} {str(sv):<40}{flag}")
    for pid, per in real.get("ci_profiles", {}).items():
        sper = shim.get("ci_profiles", {}).get(str(pid), {})
        for c in sorted(set(per) | set(sper), key=int):
            rv, sv = per.get(c), sper.get(c)
            flag = "" if rv == sv else "   <-- DIFFERS"
            if flag:
                diffs.append(f"CI profile {c} in GI profile {pid}: real {rv} shim {sv}")
            print(f"GI {pid} CI {c}: real {rv}  shim {sv}{flag}")
    print()
    if diffs:
        print(f"{len(diffs)} difference(s):")
        for d in diffs:
            print("  - " + d)
    else:
        print("no differences")
    return diffs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", type=int, default=0, help="index of the real GPU (default 0)")
    ap.add_argument("--real-lib", default=None, help="real NVML (default: libnvidia-ml.so.1 from the loader path)")
    here = os.path.dirname(os.path.abspath(__file__))
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(here, "..", "..", "target"))
    ap.add_argument("--shim-lib", default=os.path.join(target, "release", "libnvidia_ml.so"))
    ap.add_argument("--model", help="shim model to compare with (default: from the real GPU's name)")
    ap.add_argument("--json", action="store_true", help="print both dumps as JSON too")
    ap.add_argument("--dump", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--lib", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.dump:
        dump(a.lib, a.gpu)
        return 0
    if not os.path.exists(a.shim_lib):
        print(f"shim library {a.shim_lib} not found: cargo build -p nvml-shim --release", file=sys.stderr)
        return 2
    real = run_dump(a.real_lib, a.gpu)
    name = real["name"].removeprefix("NVIDIA ").strip()
    model = a.model or MODELS.get(name)
    if not model:
        print(f"real GPU {real['name']!r} is not a modelled GPU; pass --model", file=sys.stderr)
        return 2
    existing = [int(pid) for pid in real.get("ci_profiles", {})]
    with tempfile.TemporaryDirectory(prefix="nvml-shim-compare-") as tmp:
        shim = shim_dump_for(model, os.path.abspath(a.shim_lib), existing, tmp)
    # JSON object keys are strings on both sides.
    real["gi_profiles"] = {str(k): v for k, v in real["gi_profiles"].items()}
    shim["gi_profiles"] = {str(k): v for k, v in shim["gi_profiles"].items()}
    real["ci_profiles"] = {str(k): {str(c): x for c, x in v.items()} for k, v in real["ci_profiles"].items()}
    shim["ci_profiles"] = {str(k): {str(c): x for c, x in v.items()} for k, v in shim.get("ci_profiles", {}).items()}
    if a.json:
        print(json.dumps({"real": real, "shim": shim}, indent=1))
    diffs = compare(real, shim)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
