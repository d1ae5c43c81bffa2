#!/usr/bin/env python3
"""Compare the shim's MIG model with a real MIG-capable GPU. READ-ONLY.

On a machine with a real GPU (A100-40GB, A100-80GB, H100-80GB or H200-141GB) and the NVIDIA
driver, this prints the real GPU instance profile table and possible placements (through
NVIDIA's nvidia-ml-py against the real libnvidia-ml.so.1) next to the shim's model of the same
GPU model (queried through the same bindings in a subprocess loaded with the shim), and flags
every difference. Exit status 0: no difference, 1: differences, 2: usage/setup error.

It only calls query functions (nvmlSystemGet*, nvmlDeviceGet*, nvmlGpuInstanceGet*): it never
creates or destroys GPU/compute instances and never changes the MIG or CC mode. Compute instance
profiles are compared only for GPU instances that already exist on the real GPU.

Besides the tables it reads what the stand-in's failure modes can be checked against without
changing state (nvml-shim/README.md, "Modelled driver behaviour"): the driver version and the
profile names it reports (535 renamed profiles), the MIG mode current and pending (a change
waiting for a reset), and confidential computing (the system state, settings and capabilities,
and the GPU's protected memory). The shim is set up as the real GPU is (same driver version,
MIG modes and CC mode), so a difference is the model's, not the node's state.

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
    out = {"name": N.nvmlDeviceGetName(dev), "memory_total": N.nvmlDeviceGetMemoryInfo(dev).total,
           "driver_version": N.nvmlSystemGetDriverVersion()}
    try:
        out["mig_mode"] = N.nvmlDeviceGetMigMode(dev)
    except N.NVMLError as e:
        out["mig_mode"] = str(e)
    out["cc"] = cc_dump(N, dev)
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


def cc_dump(N, dev):
    """Confidential computing as NVML reports it (each query's value, or its error's name)."""
    def q(f):
        try:
            return f()
        except N.NVMLError as e:
            return type(e).__name__
        except N.NVMLLibraryMismatchError:
            return "FunctionNotFound"
        except AttributeError:
            return "FunctionNotFound"
    cc = {}
    st = q(N.nvmlSystemGetConfComputeState)
    cc["state"] = st if isinstance(st, str) else {
        "environment": st.environment, "ccFeature": st.ccFeature, "devToolsMode": st.devToolsMode}
    def settings():
        s = N.c_nvmlSystemConfComputeSettings_v1_t()
        rc = N.nvmlSystemGetConfComputeSettings(ctypes.byref(s))
        if rc != N.NVML_SUCCESS:
            raise N.NVMLError(rc)
        return {"environment": s.environment, "ccFeature": s.ccFeature,
                "devToolsMode": s.devToolsMode, "multiGpuMode": s.multiGpuMode}
    cc["settings"] = q(settings)
    caps = q(N.nvmlSystemGetConfComputeCapabilities)
    cc["capabilities"] = caps if isinstance(caps, str) else {"cpuCaps": caps.cpuCaps, "gpusCaps": caps.gpusCaps}
    mem = q(lambda: N.nvmlDeviceGetConfComputeMemSizeInfo(dev))
    cc["memory"] = mem if isinstance(mem, str) else {
        "protectedMemSizeKib": mem.protectedMemSizeKib, "unprotectedMemSizeKib": mem.unprotectedMemSizeKib}
    return cc


def real_cc_on(real):
    """Whether the real GPU is in CC mode, as the product decides it (layers/mig)."""
    st = real["cc"]["state"]
    if not isinstance(st, dict) or st.get("ccFeature") != 1:
        return False
    mem = real["cc"]["memory"]
    return not isinstance(mem, dict) or mem.get("protectedMemSizeKib", 0) > 0


def run_dump(lib, gpu, env=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--dump", "--gpu", str(gpu)]
    if lib:
        cmd += ["--lib", lib]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"query through {lib or 'libnvidia-ml.so.1'} failed:\n{r.stderr}")
    return json.loads(r.stdout)


def shim_dump_for(model, shim_lib, existing_gi_profiles, tmp, real=None):
    """The shim's view of one GPU of `model`, set up as the real GPU is (driver version, MIG
    modes, CC mode); GIs are created only in the shim's temp state."""
    fixture = os.path.join(tmp, "fixture.toml")
    driver, current, pending, cc = "570.124.06", True, True, False
    if real:
        driver = real["driver_version"]
        if isinstance(real["mig_mode"], list):
            current, pending = real["mig_mode"][0] == 1, real["mig_mode"][1] == 1
        cc = real_cc_on(real) and model in ("H100-80GB", "H200-141GB")
    b = lambda v: "true" if v else "false"
    with open(fixture, "w") as f:
        f.write(f'state = "state.json"\ndriver_version = "{driver}"\n[[gpus]]\nmodel = "{model}"\n'
                f'mig_mode = {b(current)}\nmig_mode_pending = {b(pending)}\ncc_mode = {b(cc)}\n')
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
                "try:\n"
                "    N.nvmlDeviceSetMigMode(d, 1)\n"
                "except N.NVMLError:\n"
                "    pass\n"
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
    print(f"real GPU: {real['name']}  memory {real['memory_total'] >> 20} MiB  mig {real['mig_mode']}"
          f"  driver {real['driver_version']}")
    print(f"shim    : {shim['name']}  memory {shim['memory_total'] >> 20} MiB  mig {shim['mig_mode']}"
          f"  driver {shim['driver_version']}")
    if real["memory_total"] != shim["memory_total"]:
        diffs.append(f"memory total: real {real['memory_total']} shim {shim['memory_total']}")
    # MIG mode (current, pending): the shim is set up as the real GPU; a difference is in how
    # the modes are reported.
    if real["mig_mode"] != shim["mig_mode"]:
        diffs.append(f"MIG mode [current, pending]: real {real['mig_mode']} shim {shim['mig_mode']}")
    # Confidential computing: each query's answer (or error) as the real driver gives it.
    print(f"\n{'confidential computing':<24} {'real':<44} {'shim':<44}")
    for k in ("state", "settings", "capabilities", "memory"):
        rv, sv = real["cc"].get(k), shim["cc"].get(k)
        if k == "capabilities" and isinstance(rv, dict) and isinstance(sv, dict):
            # The CPU's TEE is the host's, not the GPU's: only the GPUs' capability is modelled.
            rv, sv = {"gpusCaps": rv["gpusCaps"]}, {"gpusCaps": sv["gpusCaps"]}
        flag = "" if rv == sv else "   <-- DIFFERS"
        if flag:
            diffs.append(f"CC {k}: real {rv} shim {sv}")
        print(f"{k:<24} {str(rv):<44} {str(sv):<44}{flag}")
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
        shim = shim_dump_for(model, os.path.abspath(a.shim_lib), existing, tmp, real)
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
