"""NVIDIA's own Python bindings (nvidia-ml-py, module pynvml) as an independent client of the
shim. Run through ../run-python.sh, which sets NVML_SHIM_LIB (path of the built shim) and
NVML_SHIM_CTL (path of nvml-shim-ctl).

Each test gets its own fixture and state file in a temp folder and its own nvmlInit/nvmlShutdown
pair (the shim re-reads its configuration on the first nvmlInit).
"""

import ctypes
import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import pynvml as N

LIB = os.environ.get("NVML_SHIM_LIB")
CTL = os.environ.get("NVML_SHIM_CTL")
if not LIB:
    raise SystemExit("NVML_SHIM_LIB must name the built shim (run tests/run-python.sh)")
# Point pynvml at the shim before nvmlInit (pynvml only loads libnvidia-ml.so.1 if unset).
N.nvmlLib = ctypes.CDLL(LIB)

MiB = 1 << 20

# (profile index, profile id, slices, instance count): the same on each model with 7 slices.
PROFILE_SHAPES = [
    (N.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 7),
    (N.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1),
    (N.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 4),
    (N.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 3),
    (N.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 2),
    (N.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 1),
    (N.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 1),
]


def mig_profiles(memory_mb, names):
    """A model's profiles, in PROFILE_SHAPES' order, given each one's memory (MB) and name:
    (profile index, profile id, slices, instance count, memory MB, name)."""
    rows = zip(PROFILE_SHAPES, memory_mb, names, strict=True)
    return [shape + (mb, f"MIG {name}") for shape, mb, name in rows]


H200_PROFILES = mig_profiles(
    [16384, 16384, 33280, 33280, 71424, 71424, 143360],
    ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
)
A100_40_PROFILES = mig_profiles(
    [4864, 4864, 9856, 9856, 19968, 19968, 40192],
    ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
)
# profile id -> (placement starts, size) in memory slices (facts.md).
PLACEMENTS = {
    19: ([0, 1, 2, 3, 4, 5, 6], 1),
    20: ([0, 1, 2, 3, 4, 5, 6], 1),
    15: ([0, 2, 4, 6], 2),
    14: ([0, 2, 4], 2),
    9: ([0, 4], 4),
    5: ([0], 4),
    0: ([0], 8),
}

H200_UUID = "GPU-11111111-2222-3333-4444-555555555555"

DEFAULT_FIXTURE = f"""
state = "state.json"
[[gpus]]
model = "H200-141GB"
uuid = "{H200_UUID}"
mig_mode = true
[[gpus]]
model = "A100-40GB"
mig_mode = true
[[gpus]]
model = "H100-80GB"
mig_mode = false
"""


def placements(dev, profile_id):
    count = ctypes.c_uint(0)
    N.nvmlDeviceGetGpuInstancePossiblePlacements(dev, profile_id, None, ctypes.byref(count))
    arr = (N.c_nvmlGpuInstancePlacement_t * count.value)()
    N.nvmlDeviceGetGpuInstancePossiblePlacements(dev, profile_id, arr, ctypes.byref(count))
    return [(p.start, p.size) for p in arr[: count.value]]


def gpu_instances(dev, profile_id, max_count=7):
    arr = (N.c_nvmlGpuInstance_t * max_count)()
    count = ctypes.c_uint(0)
    N.nvmlDeviceGetGpuInstances(dev, profile_id, arr, ctypes.byref(count))
    return [arr[i] for i in range(count.value)]


def compute_instances(gi, profile_id, max_count=7):
    arr = (N.c_nvmlComputeInstance_t * max_count)()
    count = ctypes.c_uint(0)
    N.nvmlGpuInstanceGetComputeInstances(gi, profile_id, arr, ctypes.byref(count))
    return [arr[i] for i in range(count.value)]


def placement(start, size):
    """nvmlDeviceCreateGpuInstanceWithPlacement takes `const nvmlGpuInstancePlacement_t *`;
    pynvml passes the argument through, so the caller passes a pointer."""
    p = N.c_nvmlGpuInstancePlacement_t()
    p.start, p.size = start, size
    return ctypes.byref(p)


class ShimCase(unittest.TestCase):
    FIXTURE = DEFAULT_FIXTURE
    ENV_FAULTS = None

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="nvml-shim-py-")
        self.dir = self.tmp.name
        self.state = os.path.join(self.dir, "state.json")
        self.fixture = os.path.join(self.dir, "fixture.toml")
        with open(self.fixture, "w") as f:
            f.write(self.fixture_text())
        os.environ["NVML_SHIM_FIXTURE"] = self.fixture
        os.environ.pop("NVML_SHIM_STATE", None)
        if self.ENV_FAULTS:
            os.environ["NVML_SHIM_FAULTS"] = self.ENV_FAULTS
        else:
            os.environ.pop("NVML_SHIM_FAULTS", None)
        N.nvmlInit()
        self.dev = N.nvmlDeviceGetHandleByIndex(0)

    def fixture_text(self):
        return self.FIXTURE

    def tearDown(self):
        try:
            N.nvmlShutdown()
        except N.NVMLError:
            pass
        os.environ.pop("NVML_SHIM_FAULTS", None)
        self.tmp.cleanup()

    def ctl(self, *args):
        if not CTL:
            self.skipTest("NVML_SHIM_CTL not set")
        r = subprocess.run([CTL, *args], capture_output=True, text=True, env=os.environ.copy())
        self.assertEqual(r.returncode, 0, f"nvml-shim-ctl {args}: {r.stderr}")
        return r.stdout

    def gi_with_ci(self, dev=None, gi_profile=19, ci_profile=0):
        dev = dev or self.dev
        gi = N.nvmlDeviceCreateGpuInstance(dev, gi_profile)
        ci = N.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile)
        return gi, ci


class TestDevices(ShimCase):
    def test_count_names_uuids_memory(self):
        self.assertEqual(N.nvmlDeviceGetCount(), 3)
        names = [N.nvmlDeviceGetName(N.nvmlDeviceGetHandleByIndex(i)) for i in range(3)]
        self.assertEqual(names, ["NVIDIA H200", "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"])
        self.assertEqual(N.nvmlDeviceGetUUID(self.dev), H200_UUID)
        u1 = N.nvmlDeviceGetUUID(N.nvmlDeviceGetHandleByIndex(1))
        self.assertRegex(u1, r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
        by_uuid = N.nvmlDeviceGetHandleByUUID(u1)
        self.assertEqual(N.nvmlDeviceGetIndex(by_uuid), 1)
        self.assertEqual(N.nvmlDeviceGetMinorNumber(by_uuid), 1)
        with self.assertRaises(N.NVMLError_NotFound):
            N.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
        with self.assertRaises(N.NVMLError_InvalidArgument):
            N.nvmlDeviceGetHandleByIndex(3)
        mem = N.nvmlDeviceGetMemoryInfo(self.dev)
        self.assertEqual(mem.total, 143771 * MiB)
        self.assertEqual(mem.free + mem.used, mem.total)
        mem2 = N.nvmlDeviceGetMemoryInfo(N.nvmlDeviceGetHandleByIndex(1), version=N.nvmlMemory_v2)
        self.assertEqual(mem2.total, 40960 * MiB)
        self.assertEqual(N.nvmlSystemGetDriverVersion(), "570.124.06")
        self.assertTrue(N.nvmlSystemGetNVMLVersion().startswith("12."))

    def test_mig_mode(self):
        self.assertEqual(N.nvmlDeviceGetMigMode(self.dev), [1, 1])
        h100 = N.nvmlDeviceGetHandleByIndex(2)
        self.assertEqual(N.nvmlDeviceGetMigMode(h100), [0, 0])
        self.assertEqual(N.nvmlDeviceGetMaxMigDeviceCount(h100), 0)
        with self.assertRaises(N.NVMLError_NotSupported):
            N.nvmlDeviceCreateGpuInstance(h100, 19)
        with self.assertRaises(N.NVMLError_NotSupported):
            N.nvmlDeviceGetGpuInstanceRemainingCapacity(h100, 19)
        # Profile info and placements do not need MIG enabled (NVML r550+).
        info = N.nvmlDeviceGetGpuInstanceProfileInfo(h100, N.NVML_GPU_INSTANCE_PROFILE_7_SLICE)
        self.assertEqual((info.id, info.memorySizeMB), (0, 81152))
        self.assertEqual(N.nvmlDeviceSetMigMode(h100, N.NVML_DEVICE_MIG_ENABLE), N.NVML_SUCCESS)
        self.assertEqual(N.nvmlDeviceGetMigMode(h100), [1, 1])
        N.nvmlDeviceCreateGpuInstance(h100, 19)
        with self.assertRaises(N.NVMLError_InUse):
            N.nvmlDeviceSetMigMode(h100, N.NVML_DEVICE_MIG_DISABLE)

    def test_uninitialized_and_bad_handles(self):
        fn = N.nvmlLib.nvmlDeviceGetUUID
        buf = ctypes.create_string_buffer(96)
        self.assertEqual(fn(ctypes.c_void_p(0xDEADBEEF), buf, 96), N.NVML_ERROR_INVALID_ARGUMENT)
        self.assertEqual(fn(self.dev, buf, 4), N.NVML_ERROR_INSUFFICIENT_SIZE)
        gi_fn = N.nvmlLib.nvmlGpuInstanceGetInfo
        info = N.c_nvmlGpuInstanceInfo_t()
        # A device handle is not a GPU instance handle.
        self.assertEqual(gi_fn(self.dev, ctypes.byref(info)), N.NVML_ERROR_INVALID_ARGUMENT)
        N.nvmlShutdown()
        with self.assertRaises(N.NVMLError_Uninitialized):
            N.nvmlDeviceGetCount()
        with self.assertRaises(N.NVMLError_Uninitialized):
            N.nvmlShutdown()
        N.nvmlInit()
        N.nvmlInit()  # refcounted
        N.nvmlShutdown()
        self.assertEqual(N.nvmlDeviceGetCount(), 3)
        self.assertEqual(str(N.NVMLError(N.NVML_ERROR_INSUFFICIENT_RESOURCES)), "Insufficient resources")


class TestGpuInstanceProfiles(ShimCase):
    def check_profiles(self, dev, table):
        for index, pid, slices, count, mem, name in table:
            for version in (2, 1):
                info = N.nvmlDeviceGetGpuInstanceProfileInfo(dev, index, version=version)
                self.assertEqual(
                    (info.id, info.sliceCount, info.instanceCount, info.memorySizeMB),
                    (pid, slices, count, mem),
                    f"profile index {index} (v{version})",
                )
                self.assertEqual(info.isP2pSupported, 0)
            self.assertEqual(info.multiprocessorCount > 0, True)
            info = N.nvmlDeviceGetGpuInstanceProfileInfo(dev, index)
            self.assertEqual(info.name, name)
            starts, size = PLACEMENTS[pid]
            self.assertEqual(placements(dev, pid), [(s, size) for s in starts], name)
        for unsupported in (
            N.NVML_GPU_INSTANCE_PROFILE_8_SLICE,
            N.NVML_GPU_INSTANCE_PROFILE_6_SLICE,
            N.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1,
        ):
            with self.assertRaises(N.NVMLError_NotSupported):
                N.nvmlDeviceGetGpuInstanceProfileInfo(dev, unsupported)
        with self.assertRaises(N.NVMLError_InvalidArgument):
            N.nvmlDeviceGetGpuInstanceProfileInfo(dev, N.NVML_GPU_INSTANCE_PROFILE_COUNT)

    def test_h200_profiles(self):
        self.check_profiles(self.dev, H200_PROFILES)
        sm = {p.id: p.multiprocessorCount for p in
              (N.nvmlDeviceGetGpuInstanceProfileInfo(self.dev, i[0]) for i in H200_PROFILES)}
        self.assertEqual(sm, {19: 16, 20: 16, 15: 26, 14: 32, 9: 60, 5: 64, 0: 132})

    def test_a100_40gb_profiles(self):
        self.check_profiles(N.nvmlDeviceGetHandleByIndex(1), A100_40_PROFILES)
        me = N.nvmlDeviceGetGpuInstanceProfileInfo(N.nvmlDeviceGetHandleByIndex(1),
                                                   N.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1)
        self.assertEqual((me.decoderCount, me.jpegCount, me.ofaCount), (1, 1, 1))

    def test_possible_placements_sizes(self):
        count = ctypes.c_uint(0)
        N.nvmlDeviceGetGpuInstancePossiblePlacements(self.dev, 19, None, ctypes.byref(count))
        self.assertEqual(count.value, 7)
        small = (N.c_nvmlGpuInstancePlacement_t * 2)()
        count = ctypes.c_uint(2)
        with self.assertRaises(N.NVMLError_InsufficientSize):
            N.nvmlDeviceGetGpuInstancePossiblePlacements(self.dev, 19, small, ctypes.byref(count))
        self.assertEqual(count.value, 7)
        with self.assertRaises(N.NVMLError_InvalidArgument):
            N.nvmlDeviceGetGpuInstancePossiblePlacements(self.dev, 77, None, ctypes.byref(count))
        # Possible placements do not depend on what is occupied.
        N.nvmlDeviceCreateGpuInstance(self.dev, 0)
        self.assertEqual(placements(self.dev, 19), [(s, 1) for s in range(7)])

    def test_struct_version_mismatch(self):
        info = N.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.version = 0x01000098
        fn = N.nvmlLib.nvmlDeviceGetGpuInstanceProfileInfoV
        self.assertEqual(fn(self.dev, 0, ctypes.byref(info)), N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        info.version = N.nvmlGpuInstanceProfileInfo_v2
        self.assertEqual(fn(self.dev, 0, ctypes.byref(info)), N.NVML_SUCCESS)
        self.assertEqual(info.id, 19)
        mem = N.c_nvmlMemory_v2_t()
        mem.version = 0x02000020
        self.assertEqual(N.nvmlLib.nvmlDeviceGetMemoryInfo_v2(self.dev, ctypes.byref(mem)),
                         N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        gi = N.nvmlDeviceCreateGpuInstance(self.dev, 0)
        ci_info = N.c_nvmlComputeInstanceProfileInfo_v2_t()
        ci_info.version = N.nvmlComputeInstanceProfileInfo_v2 + 1
        fn = N.nvmlLib.nvmlGpuInstanceGetComputeInstanceProfileInfoV
        self.assertEqual(fn(gi, 0, 0, ctypes.byref(ci_info)), N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        with self.assertRaises(N.NVMLError_ArgumentVersionMismatch):
            N.nvmlDeviceGetMemoryInfo(self.dev, version=0x03000028)


class TestGpuInstances(ShimCase):
    def test_remaining_capacity(self):
        self.assertEqual(N.nvmlDeviceGetGpuInstanceRemainingCapacity(self.dev, 19), 7)
        self.assertEqual(N.nvmlDeviceGetGpuInstanceRemainingCapacity(self.dev, 9), 2)
        gi = N.nvmlDeviceCreateGpuInstance(self.dev, 9)
        info = N.nvmlGpuInstanceGetInfo(gi)
        # The driver fills from the top: first 3g goes to memory slices 4-7 (GI id 2).
        self.assertEqual((info.id, info.profileId, info.placement.start, info.placement.size), (2, 9, 4, 4))
        self.assertEqual(N.nvmlDeviceGetGpuInstanceRemainingCapacity(self.dev, 19), 4)
        self.assertEqual(N.nvmlDeviceGetGpuInstanceRemainingCapacity(self.dev, 9), 1)
        self.assertEqual(N.nvmlDeviceGetGpuInstanceRemainingCapacity(self.dev, 0), 0)
        self.assertEqual(N.nvmlDeviceGetGpuInstanceRemainingCapacity(self.dev, 5), 1)
        with self.assertRaises(N.NVMLError_InvalidArgument):
            N.nvmlDeviceGetGpuInstanceRemainingCapacity(self.dev, 77)

    def test_create_with_and_without_placement(self):
        gi = N.nvmlDeviceCreateGpuInstanceWithPlacement(self.dev, 14, placement(2, 2))
        info = N.nvmlGpuInstanceGetInfo(gi)
        self.assertEqual((info.id, info.placement.start, info.placement.size), (4, 2, 2))
        self.assertEqual(N.nvmlDeviceGetUUID(info.device), H200_UUID)
        gi1 = N.nvmlDeviceCreateGpuInstance(self.dev, 19)
        self.assertEqual(N.nvmlGpuInstanceGetInfo(gi1).id, 13)  # 1g at slice 6
        ids = sorted(N.nvmlGpuInstanceGetInfo(g).id for g in gpu_instances(self.dev, 19))
        self.assertEqual(ids, [13])
        same = N.nvmlDeviceGetGpuInstanceById(self.dev, 4)
        self.assertEqual(N.nvmlGpuInstanceGetInfo(same).profileId, 14)
        with self.assertRaises(N.NVMLError_NotFound):
            N.nvmlDeviceGetGpuInstanceById(self.dev, 0)
        with self.assertRaises(N.NVMLError_InvalidArgument):
            N.nvmlDeviceCreateGpuInstanceWithPlacement(self.dev, 14, placement(1, 2))

    def test_occupied_placement_is_insufficient_resources(self):
        N.nvmlDeviceCreateGpuInstanceWithPlacement(self.dev, 14, placement(2, 2))
        with self.assertRaises(N.NVMLError_InsufficientResources):
            N.nvmlDeviceCreateGpuInstanceWithPlacement(self.dev, 14, placement(2, 2))
        with self.assertRaises(N.NVMLError_InsufficientResources):
            N.nvmlDeviceCreateGpuInstanceWithPlacement(self.dev, 19, placement(3, 1))
        with self.assertRaises(N.NVMLError_InsufficientResources):
            N.nvmlDeviceCreateGpuInstance(self.dev, 0)
        for _ in range(5):
            N.nvmlDeviceCreateGpuInstance(self.dev, 19)
        with self.assertRaises(N.NVMLError_InsufficientResources):
            N.nvmlDeviceCreateGpuInstance(self.dev, 19)

    def test_destroy_with_cis_in_use_then_ok(self):
        gi, ci = self.gi_with_ci()
        with self.assertRaises(N.NVMLError_InUse):
            N.nvmlGpuInstanceDestroy(gi)
        N.nvmlComputeInstanceDestroy(ci)
        N.nvmlGpuInstanceDestroy(gi)
        self.assertEqual(gpu_instances(self.dev, 19), [])
        with self.assertRaises(N.NVMLError_InvalidArgument):
            N.nvmlGpuInstanceDestroy(gi)  # stale handle
        # A new GI with the same id is not reachable through the old handle.
        N.nvmlDeviceCreateGpuInstance(self.dev, 19)
        with self.assertRaises(N.NVMLError_InvalidArgument):
            N.nvmlGpuInstanceGetInfo(gi)


class TestComputeInstances(ShimCase):
    def test_ci_profiles(self):
        gi = N.nvmlDeviceCreateGpuInstance(self.dev, 0)
        got = []
        for idx in range(N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                p = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, idx, N.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
                got.append((idx, p.id, p.sliceCount, p.instanceCount, p.name))
            except N.NVMLError_NotSupported:
                pass
        self.assertEqual(got, [
            (0, 0, 1, 7, "MIG 1c.7g.141gb"),
            (1, 1, 2, 3, "MIG 2c.7g.141gb"),
            (2, 2, 3, 2, "MIG 3c.7g.141gb"),
            (3, 3, 4, 1, "MIG 4c.7g.141gb"),
            (4, 4, 7, 1, "MIG 7g.141gb"),
        ])
        v1 = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 4, 0, version=1)
        self.assertEqual((v1.sliceCount, v1.multiprocessorCount), (7, 132))
        with self.assertRaises(N.NVMLError_InvalidArgument):
            N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 1)
        small = N.nvmlDeviceCreateGpuInstance(N.nvmlDeviceGetHandleByIndex(1), 19)
        with self.assertRaises(N.NVMLError_NotSupported):
            N.nvmlGpuInstanceGetComputeInstanceProfileInfo(small, 1, 0)

    def test_create_destroy_ci(self):
        gi = N.nvmlDeviceCreateGpuInstance(self.dev, 9)  # 3g
        self.assertEqual(N.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, 0), 3)
        cis = [N.nvmlGpuInstanceCreateComputeInstance(gi, 0) for _ in range(3)]
        infos = [N.nvmlComputeInstanceGetInfo(c) for c in cis]
        self.assertEqual([(i.id, i.placement.start, i.placement.size) for i in infos],
                         [(0, 0, 1), (1, 1, 1), (2, 2, 1)])
        self.assertEqual(N.nvmlGpuInstanceGetInfo(infos[0].gpuInstance).id, 2)
        self.assertEqual(N.nvmlDeviceGetUUID(infos[0].device), H200_UUID)
        with self.assertRaises(N.NVMLError_InsufficientResources):
            N.nvmlGpuInstanceCreateComputeInstance(gi, 0)
        self.assertEqual(len(compute_instances(gi, 0)), 3)
        N.nvmlComputeInstanceDestroy(cis[1])
        self.assertEqual(N.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, 0), 1)
        again = N.nvmlGpuInstanceCreateComputeInstance(gi, 0)
        self.assertEqual(N.nvmlComputeInstanceGetInfo(again).id, 1)  # lowest free CI id
        by_id = N.nvmlGpuInstanceGetComputeInstanceById(gi, 2)
        self.assertEqual(N.nvmlComputeInstanceGetInfo(by_id).placement.start, 2)
        with self.assertRaises(N.NVMLError_NotFound):
            N.nvmlGpuInstanceGetComputeInstanceById(gi, 5)
        with self.assertRaises(N.NVMLError_InvalidArgument):
            N.nvmlComputeInstanceDestroy(cis[1])


class TestMigDevices(ShimCase):
    def test_mig_device_handles(self):
        self.assertEqual(N.nvmlDeviceGetMaxMigDeviceCount(self.dev), 7)
        with self.assertRaises(N.NVMLError_NotFound):
            N.nvmlDeviceGetMigDeviceHandleByIndex(self.dev, 0)
        gi, ci = self.gi_with_ci(gi_profile=14, ci_profile=1)
        gi_id = N.nvmlGpuInstanceGetInfo(gi).id
        mig = N.nvmlDeviceGetMigDeviceHandleByIndex(self.dev, 0)
        self.assertTrue(N.nvmlDeviceIsMigDeviceHandle(mig).value)
        self.assertFalse(N.nvmlDeviceIsMigDeviceHandle(self.dev).value)
        self.assertEqual(N.nvmlDeviceGetGpuInstanceId(mig), gi_id)
        self.assertEqual(N.nvmlDeviceGetComputeInstanceId(mig), 0)
        parent = N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        self.assertEqual(N.nvmlDeviceGetUUID(parent), H200_UUID)
        uuid = N.nvmlDeviceGetUUID(mig)
        self.assertRegex(uuid, r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
        self.assertEqual(N.nvmlDeviceGetName(mig), "NVIDIA H200 MIG 2g.35gb")
        self.assertEqual(N.nvmlDeviceGetMemoryInfo(mig).total, 33280 * MiB)
        self.assertEqual(N.nvmlDeviceGetGpuInstanceId(N.nvmlDeviceGetHandleByUUID(uuid)), gi_id)
        with self.assertRaises(N.NVMLError_NotSupported):
            N.nvmlDeviceGetGpuInstanceId(self.dev)
        with self.assertRaises(N.NVMLError_InvalidArgument):
            N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self.dev)
        with self.assertRaises(N.NVMLError_InvalidArgument):
            N.nvmlDeviceGetMigDeviceHandleByIndex(self.dev, 7)
        # The MIG UUID is stable per (GPU, GI id, CI id): recreate the same ids.
        N.nvmlComputeInstanceDestroy(ci)
        N.nvmlGpuInstanceDestroy(gi)
        with self.assertRaises(N.NVMLError_InvalidArgument):
            N.nvmlDeviceGetUUID(mig)
        gi2 = N.nvmlDeviceCreateGpuInstance(self.dev, 14)
        N.nvmlGpuInstanceCreateComputeInstance(gi2, 1)
        self.assertEqual(N.nvmlDeviceGetUUID(N.nvmlDeviceGetMigDeviceHandleByIndex(self.dev, 0)), uuid)

    def test_mig_devices_enumerate_in_order(self):
        a, _ = self.gi_with_ci(gi_profile=19)
        b, _ = self.gi_with_ci(gi_profile=19)
        N.nvmlGpuInstanceCreateComputeInstance(N.nvmlDeviceCreateGpuInstance(self.dev, 14), 0)
        ids = []
        for i in range(3):
            m = N.nvmlDeviceGetMigDeviceHandleByIndex(self.dev, i)
            ids.append((N.nvmlDeviceGetGpuInstanceId(m), N.nvmlDeviceGetComputeInstanceId(m)))
        self.assertEqual(ids, [(4, 0), (12, 0), (13, 0)])  # 2g lands at 2: slices 5,6 taken
        uuids = {N.nvmlDeviceGetUUID(N.nvmlDeviceGetMigDeviceHandleByIndex(self.dev, i)) for i in range(3)}
        self.assertEqual(len(uuids), 3)


class TestFaultsViaCtl(ShimCase):
    def test_gi_and_ci_create_faults(self):
        self.ctl("arm", "gi-create", "INSUFFICIENT_RESOURCES")
        with self.assertRaises(N.NVMLError_InsufficientResources):
            N.nvmlDeviceCreateGpuInstance(self.dev, 0)
        gi = N.nvmlDeviceCreateGpuInstance(self.dev, 0)  # consumed: next succeeds
        self.ctl("arm", "ci-create", "UNKNOWN", "--count", "2")
        for _ in range(2):
            with self.assertRaises(N.NVMLError_Unknown):
                N.nvmlGpuInstanceCreateComputeInstance(gi, 4)
        N.nvmlGpuInstanceCreateComputeInstance(gi, 4)
        self.assertEqual(json.loads(self.ctl("show"))["faults"]["ci_create"], [])

    def test_destroy_in_use(self):
        gi, ci = self.gi_with_ci()
        self.ctl("arm", "destroy-in-use", "2")
        with self.assertRaises(N.NVMLError_InUse):
            N.nvmlComputeInstanceDestroy(ci)
        with self.assertRaises(N.NVMLError_InUse):
            N.nvmlComputeInstanceDestroy(ci)
        N.nvmlComputeInstanceDestroy(ci)
        N.nvmlGpuInstanceDestroy(gi)

    def test_lost_gpu(self):
        other = N.nvmlDeviceGetHandleByIndex(1)
        gi = N.nvmlDeviceCreateGpuInstance(other, 19)
        self.ctl("arm", "lose-gpu", "1")
        with self.assertRaises(N.NVMLError_GpuIsLost):
            N.nvmlDeviceGetUUID(other)
        with self.assertRaises(N.NVMLError_GpuIsLost):
            N.nvmlGpuInstanceDestroy(gi)
        with self.assertRaises(N.NVMLError_GpuIsLost):
            N.nvmlDeviceGetHandleByIndex(1)
        N.nvmlDeviceGetUUID(self.dev)  # other GPUs unaffected
        self.ctl("restore-gpu", "1")
        N.nvmlGpuInstanceDestroy(gi)

    def test_list_and_reset(self):
        self.gi_with_ci()
        rows = json.loads(self.ctl("list", "--format", "json"))
        mine = [r for r in rows if r["gpu"] == "0"]
        self.assertEqual((mine[0]["gi"], mine[0]["ci"]), ("13", "0"))
        self.assertEqual(mine[0]["mig_uuid"], N.nvmlDeviceGetUUID(N.nvmlDeviceGetMigDeviceHandleByIndex(self.dev, 0)))
        self.assertIn("gpu,model,uuid", self.ctl("list", "--format", "csv"))
        self.ctl("reset")
        self.assertEqual(gpu_instances(self.dev, 19), [])


class TestFaultsViaEnv(ShimCase):
    ENV_FAULTS = "gi_create=NO_PERMISSION;destroy_in_use=1;lost=2"

    def test_env_faults_are_process_local(self):
        with self.assertRaises(N.NVMLError_NoPermission):
            N.nvmlDeviceCreateGpuInstance(self.dev, 19)
        gi = N.nvmlDeviceCreateGpuInstance(self.dev, 19)
        with self.assertRaises(N.NVMLError_InUse):
            N.nvmlGpuInstanceDestroy(gi)
        N.nvmlGpuInstanceDestroy(gi)
        with self.assertRaises(N.NVMLError_GpuIsLost):
            N.nvmlDeviceGetHandleByIndex(2)
        # Nothing of it lands in the shared state file.
        with open(self.state) as f:
            st = json.load(f)
        self.assertEqual(st["faults"], {"gi_create": [], "ci_create": [], "destroy_in_use": 0})
        self.assertFalse(st["gpus"][2]["lost"])


class TestFaultsViaFixture(ShimCase):
    FIXTURE = DEFAULT_FIXTURE + '\n[faults]\nci_create = ["INSUFFICIENT_RESOURCES"]\n'

    def test_fixture_fault_seeds_state(self):
        gi = N.nvmlDeviceCreateGpuInstance(self.dev, 19)
        with self.assertRaises(N.NVMLError_InsufficientResources):
            N.nvmlGpuInstanceCreateComputeInstance(gi, 0)
        N.nvmlGpuInstanceCreateComputeInstance(gi, 0)


CHILD = textwrap.dedent("""
    import ctypes, json, os, sys
    import pynvml as N
    N.nvmlLib = ctypes.CDLL(os.environ["NVML_SHIM_LIB"])
    N.nvmlInit()
    dev = N.nvmlDeviceGetHandleByIndex(0)
    action = sys.argv[1]
    out = {}
    if action == "list":
        arr = (N.c_nvmlGpuInstance_t * 7)()
        n = ctypes.c_uint(0)
        N.nvmlDeviceGetGpuInstances(dev, int(sys.argv[2]), arr, ctypes.byref(n))
        out["gis"] = sorted(N.nvmlGpuInstanceGetInfo(arr[i]).id for i in range(n.value))
        out["migs"] = []
        for i in range(7):
            try:
                out["migs"].append(N.nvmlDeviceGetUUID(N.nvmlDeviceGetMigDeviceHandleByIndex(dev, i)))
            except N.NVMLError_NotFound:
                break
    elif action == "create":
        ok, fail = [], 0
        for _ in range(int(sys.argv[3])):
            try:
                ok.append(N.nvmlGpuInstanceGetInfo(N.nvmlDeviceCreateGpuInstance(dev, int(sys.argv[2]))).id)
            except N.NVMLError_InsufficientResources:
                fail += 1
        out = {"ok": ok, "fail": fail}
    N.nvmlShutdown()
    print(json.dumps(out))
""")


class TestCrossProcess(ShimCase):
    def child(self, *args):
        env = os.environ.copy()
        env["NVML_SHIM_LIB"] = LIB
        return subprocess.Popen([sys.executable, "-c", CHILD, *map(str, args)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(self, p):
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        return json.loads(out)

    def test_two_processes_see_the_same_instances(self):
        gi, _ = self.gi_with_ci()
        mig_uuid = N.nvmlDeviceGetUUID(N.nvmlDeviceGetMigDeviceHandleByIndex(self.dev, 0))
        seen = self.result(self.child("list", 19))
        self.assertEqual(seen, {"gis": [13], "migs": [mig_uuid]})
        made = self.result(self.child("create", 19, 2))
        self.assertEqual(made, {"ok": [12, 11], "fail": 0})
        ids = sorted(N.nvmlGpuInstanceGetInfo(g).id for g in gpu_instances(self.dev, 19))
        self.assertEqual(ids, [11, 12, 13])

    def test_concurrent_creates_never_double_allocate(self):
        procs = [self.child("create", 19, 3) for _ in range(4)]
        results = [self.result(p) for p in procs]
        ok = [i for r in results for i in r["ok"]]
        self.assertEqual(sorted(ok), list(range(7, 14)))
        self.assertEqual(sum(r["fail"] for r in results), 12 - 7)


@unittest.skipUnless(os.geteuid() == 0, "device node layout needs root (mknod)")
class TestDeviceLayout(ShimCase):
    INSTANCE_CAPS = True

    def fixture_text(self):
        return ('dev_dir = "dev"\nmig_minors = "proc/mig-minors"\nproc_devices = "proc/devices"\n'
                + f'instance_caps = {"true" if self.INSTANCE_CAPS else "false"}\n'
                + DEFAULT_FIXTURE)

    def node(self, name):
        st = os.stat(os.path.join(self.dir, "dev", name), follow_symlinks=False)
        self.assertTrue(stat.S_ISCHR(st.st_mode), name)
        return os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode)

    def caps(self):
        return sorted(int(n[len("nvidia-cap"):]) for n in os.listdir(os.path.join(self.dir, "dev", "nvidia-caps")))

    def test_static_nodes_and_files(self):
        self.assertEqual(self.node("nvidia0")[:2], (195, 0))
        self.assertEqual(self.node("nvidia2")[:2], (195, 2))
        self.assertEqual(self.node("nvidiactl")[:2], (195, 255))
        self.assertEqual(self.node("nvidia-uvm")[:2], (509, 0))
        self.assertEqual(self.node("nvidia-uvm-tools")[:2], (509, 1))
        self.assertEqual(self.node("nvidia-caps/nvidia-cap1"), (508, 1, 0o400))
        self.assertEqual(self.caps(), [1, 2])
        with open(os.path.join(self.dir, "proc", "devices")) as f:
            text = f.read()
        self.assertIn("Character devices:\n195 nvidia-frontend\n508 nvidia-caps\n509 nvidia-uvm\n", text)
        self.assertIn("Block devices:", text)
        with open(os.path.join(self.dir, "proc", "mig-minors")) as f:
            lines = f.read().splitlines()
        self.assertEqual(lines[:4], ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"])
        self.assertIn("gpu1/gi13/ci0/access 256", lines)

    def test_cap_nodes_follow_instances(self):
        dev1 = N.nvmlDeviceGetHandleByIndex(1)
        gi, ci = self.gi_with_ci(dev=dev1)  # gpu1 gi13 ci0
        gi_minor = 3 + 135 + 13 * 9
        self.assertEqual(self.caps(), [1, 2, gi_minor, gi_minor + 1])
        self.assertEqual(self.node(f"nvidia-caps/nvidia-cap{gi_minor}"), (508, gi_minor, 0o444))
        N.nvmlComputeInstanceDestroy(ci)
        self.assertEqual(self.caps(), [1, 2, gi_minor])
        N.nvmlGpuInstanceDestroy(gi)
        self.assertEqual(self.caps(), [1, 2])
        # ctl layout repairs a deleted node.
        os.unlink(os.path.join(self.dir, "dev", "nvidiactl"))
        self.ctl("layout")
        self.assertEqual(self.node("nvidiactl")[:2], (195, 255))

    def reinit(self):
        N.nvmlShutdown()
        N.nvmlInit()

    def test_driver_like_no_instance_nodes(self):
        """Without instance_caps, as the real driver: instances make no node, and a node made
        by someone else (the prolog) stays and does not make the next init lay out again."""
        self.reinit_with(instance_caps=False)
        dev1 = N.nvmlDeviceGetHandleByIndex(1)
        gi, ci = self.gi_with_ci(dev=dev1)
        self.assertEqual(self.caps(), [1, 2])
        minor = 3 + 135 + 13 * 9
        path = os.path.join(self.dir, "dev", "nvidia-caps", f"nvidia-cap{minor}")
        os.mknod(path, 0o444 | stat.S_IFCHR, os.makedev(508, minor))
        ino = os.stat(os.path.join(self.dir, "dev", "nvidia0")).st_ino
        self.reinit()
        self.assertEqual(os.stat(os.path.join(self.dir, "dev", "nvidia0")).st_ino, ino)
        N.nvmlComputeInstanceDestroy(ci)
        N.nvmlGpuInstanceDestroy(gi)
        self.assertEqual(self.caps(), [1, 2, minor])

    def reinit_with(self, instance_caps):
        N.nvmlShutdown()
        self.INSTANCE_CAPS = instance_caps
        with open(self.fixture, "w") as f:
            f.write(self.fixture_text())
        N.nvmlInit()

    def test_init_lays_out_again_only_what_changed(self):
        # Untouched since the last layout (and the caps changes made through NVML): an init
        # leaves every file as it is.
        dev1 = N.nvmlDeviceGetHandleByIndex(1)
        self.gi_with_ci(dev=dev1)
        paths = ["dev/nvidia0", "dev/nvidia-caps/nvidia-cap1", "proc/devices", "proc/mig-minors"]
        ino = lambda p: os.stat(os.path.join(self.dir, p), follow_symlinks=False).st_ino
        before = [ino(p) for p in paths]
        self.reinit()
        self.assertEqual([ino(p) for p in paths], before)
        # A removed node, a removed cap node, a rewritten proc-devices: each is made again.
        os.unlink(os.path.join(self.dir, "dev", "nvidia1"))
        self.reinit()
        self.assertEqual(self.node("nvidia1")[:2], (195, 1))
        caps = self.caps()
        os.unlink(os.path.join(self.dir, "dev", "nvidia-caps", f"nvidia-cap{caps[-1]}"))
        self.reinit()
        self.assertEqual(self.caps(), caps)
        devices = os.path.join(self.dir, "proc", "devices")
        os.chmod(devices, 0o644)
        with open(devices, "w") as f:
            f.write("Character devices:\n")
        self.reinit()
        with open(devices) as f:
            self.assertIn("509 nvidia-uvm", f.read())


class TestConfidentialComputing(ShimCase):
    """CC mode as NVML reports it: a system state (nvmlSystemGetConfComputeState) and the
    protected memory of a GPU in CC mode; such a GPU makes no GPU instance."""
    FIXTURE = """
state = "state.json"
[[gpus]]
model = "H200-141GB"
cc_mode = true
[[gpus]]
model = "H100-80GB"
"""

    def test_system_state_protected_memory_and_no_slices(self):
        st = N.nvmlSystemGetConfComputeState()
        self.assertEqual(st.ccFeature, N.NVML_CC_SYSTEM_FEATURE_ENABLED)
        self.assertEqual(st.environment, N.NVML_CC_SYSTEM_ENVIRONMENT_PROD)
        self.assertEqual(st.devToolsMode, N.NVML_CC_SYSTEM_DEVTOOLS_MODE_OFF)
        settings = N.c_nvmlSystemConfComputeSettings_v1_t()
        self.assertEqual(N.nvmlSystemGetConfComputeSettings(ctypes.byref(settings)), N.NVML_SUCCESS)
        self.assertEqual((settings.ccFeature, settings.multiGpuMode), (1, N.NVML_CC_SYSTEM_MULTIGPU_NONE))
        caps = N.nvmlSystemGetConfComputeCapabilities()
        self.assertEqual(caps.gpusCaps, N.NVML_CC_SYSTEM_GPUS_CC_CAPABLE)
        mem = N.nvmlDeviceGetConfComputeMemSizeInfo(self.dev)
        self.assertEqual(mem.protectedMemSizeKib * 1024, N.nvmlDeviceGetMemoryInfo(self.dev).total)
        other = N.nvmlDeviceGetHandleByIndex(1)
        with self.assertRaises(N.NVMLError_NotSupported):
            N.nvmlDeviceGetConfComputeMemSizeInfo(other)
        with self.assertRaises(N.NVMLError_NotSupported):
            N.nvmlDeviceCreateGpuInstance(self.dev, 19)
        N.nvmlGpuInstanceDestroy(N.nvmlDeviceCreateGpuInstance(other, 19))

    def test_ctl_turns_cc_mode_off_and_on(self):
        self.ctl("cc", "0", "off")
        self.assertEqual(N.nvmlSystemGetConfComputeState().ccFeature, N.NVML_CC_SYSTEM_FEATURE_DISABLED)
        gi = N.nvmlDeviceCreateGpuInstance(self.dev, 19)
        N.nvmlGpuInstanceDestroy(gi)
        self.ctl("cc", "1", "on")
        self.assertEqual(N.nvmlSystemGetConfComputeState().ccFeature, N.NVML_CC_SYSTEM_FEATURE_ENABLED)
        self.assertGreater(N.nvmlDeviceGetConfComputeMemSizeInfo(N.nvmlDeviceGetHandleByIndex(1)).protectedMemSizeKib, 0)

    def test_a_settings_struct_of_another_version_is_refused(self):
        settings = N.c_nvmlSystemConfComputeSettings_v1_t()
        settings.version = 0x2000014
        self.assertEqual(N.nvmlSystemGetConfComputeSettings(ctypes.byref(settings)),
                         N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)


class TestConfidentialComputingOff(ShimCase):
    def test_no_cc_gpu_no_cc_state(self):
        self.assertEqual(N.nvmlSystemGetConfComputeState().ccFeature, N.NVML_CC_SYSTEM_FEATURE_DISABLED)
        # An A100 in the fixture: the GPUs are not all CC capable.
        self.assertEqual(N.nvmlSystemGetConfComputeCapabilities().gpusCaps,
                         N.NVML_CC_SYSTEM_GPUS_CC_NOT_CAPABLE)
        with self.assertRaises(N.NVMLError_NotSupported):
            N.nvmlDeviceGetConfComputeMemSizeInfo(self.dev)


class TestMigModePending(ShimCase):
    """nvmlDeviceGetMigMode's current and pending modes differ while a change waits for a GPU
    reset; nvmlDeviceSetMigMode reports NVML_ERROR_RESET_REQUIRED as its activation status."""
    FIXTURE = """
state = "state.json"
[[gpus]]
model = "A100-80GB"
reset_required = true
[[gpus]]
model = "H100-80GB"
mig_mode = true
mig_mode_pending = false
"""

    def test_set_mig_mode_waits_for_a_reset(self):
        self.assertEqual(N.nvmlDeviceGetMigMode(self.dev), [1, 1])
        self.assertEqual(N.nvmlDeviceSetMigMode(self.dev, N.NVML_DEVICE_MIG_DISABLE),
                         N.NVML_ERROR_RESET_REQUIRED)
        self.assertEqual(N.nvmlDeviceGetMigMode(self.dev), [1, 0])
        # Still in MIG mode until the reset.
        N.nvmlGpuInstanceDestroy(N.nvmlDeviceCreateGpuInstance(self.dev, 19))
        self.ctl("reset-gpu", "0")
        self.assertEqual(N.nvmlDeviceGetMigMode(self.dev), [0, 0])

    def test_pending_from_the_fixture_and_from_ctl(self):
        other = N.nvmlDeviceGetHandleByIndex(1)
        self.assertEqual(N.nvmlDeviceGetMigMode(other), [1, 0])
        self.ctl("mig", "1", "on", "--pending")
        self.assertEqual(N.nvmlDeviceGetMigMode(other), [1, 1])
        self.ctl("mig", "1", "off", "--pending")
        gi = N.nvmlDeviceCreateGpuInstance(other, 19)
        self.ctl("reset-gpu", "1")  # a reset takes the instances with it
        self.assertEqual(N.nvmlDeviceGetMigMode(other), [0, 0])
        with self.assertRaises(N.NVMLError_InvalidArgument):
            N.nvmlGpuInstanceGetInfo(gi)

    def test_without_reset_required_the_mode_changes_at_once(self):
        other = N.nvmlDeviceGetHandleByIndex(1)
        self.assertEqual(N.nvmlDeviceSetMigMode(other, N.NVML_DEVICE_MIG_DISABLE), N.NVML_SUCCESS)
        self.assertEqual(N.nvmlDeviceGetMigMode(other), [0, 0])


class TestLostMidSession(ShimCase):
    def test_a_gpu_lost_after_its_slice_was_made(self):
        gi, ci = self.gi_with_ci()
        mig = N.nvmlDeviceGetMigDeviceHandleByIndex(self.dev, 0)
        self.ctl("arm", "lose-gpu", "0")
        for call in (lambda: N.nvmlComputeInstanceDestroy(ci),
                     lambda: N.nvmlGpuInstanceDestroy(gi),
                     lambda: N.nvmlDeviceGetUUID(mig),
                     lambda: N.nvmlDeviceGetMigMode(self.dev),
                     lambda: N.nvmlDeviceGetHandleByIndex(0)):
            with self.assertRaises(N.NVMLError_GpuIsLost):
                call()
        self.ctl("restore-gpu", "0")
        N.nvmlComputeInstanceDestroy(ci)
        N.nvmlGpuInstanceDestroy(gi)


class TestDriverProfileNames(ShimCase):
    """Drivers 535 and 545 call the A100-80GB's 3g.40gb profile 3g.39gb (mig-parted issue 31);
    a fixture can rename any profile."""
    FIXTURE = """
state = "state.json"
driver_version = "535.129.03"
[[gpus]]
model = "A100-80GB"
[[gpus]]
model = "H200-141GB"
profile_names = { "1g.18gb" = "1g.17gb" }
"""

    def names(self, dev):
        out = []
        for idx in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                out.append(N.nvmlDeviceGetGpuInstanceProfileInfo(dev, idx).name)
            except (N.NVMLError_NotSupported, N.NVMLError_InvalidArgument):
                pass
        return out

    def test_535_names(self):
        self.assertEqual(N.nvmlSystemGetDriverVersion(), "535.129.03")
        self.assertEqual(self.names(self.dev), [
            "MIG 1g.10gb", "MIG 2g.20gb", "MIG 3g.39gb", "MIG 4g.40gb", "MIG 7g.80gb",
            "MIG 1g.10gb+me", "MIG 1g.20gb"])
        self.assertEqual(N.nvmlDeviceGetGpuInstanceProfileInfoById(self.dev, 9).name, "MIG 3g.39gb")
        gi = N.nvmlDeviceCreateGpuInstance(self.dev, 9)
        full = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, N.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 0)
        self.assertEqual(full.name, "MIG 3g.39gb")
        part = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, N.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 0)
        self.assertEqual(part.name, "MIG 1c.3g.39gb")
        N.nvmlGpuInstanceCreateComputeInstance(gi, N.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
        mig = N.nvmlDeviceGetMigDeviceHandleByIndex(self.dev, 0)
        self.assertEqual(N.nvmlDeviceGetName(mig), "NVIDIA A100-SXM4-80GB MIG 3g.39gb")

    def test_a_fixture_rename(self):
        h200 = N.nvmlDeviceGetHandleByIndex(1)
        self.assertIn("MIG 1g.17gb", self.names(h200))
        self.assertNotIn("MIG 1g.18gb", self.names(h200))


class TestSlowCreates(ShimCase):
    def test_creates_and_destroys_wait_the_armed_delay(self):
        self.ctl("arm", "slow-create", "300")
        t = time.monotonic()
        gi = N.nvmlDeviceCreateGpuInstance(self.dev, 19)
        self.assertGreaterEqual(time.monotonic() - t, 0.3)
        self.ctl("arm", "slow-create", "0")
        self.ctl("arm", "slow-destroy", "200")
        t = time.monotonic()
        N.nvmlGpuInstanceDestroy(gi)
        self.assertGreaterEqual(time.monotonic() - t, 0.2)
        self.ctl("disarm")
        self.assertNotIn("destroy_delay_ms", json.loads(self.ctl("show"))["faults"])


class TestSlowCreatesViaEnv(ShimCase):
    ENV_FAULTS = "create_delay_ms=200"

    def test_a_process_local_delay(self):
        t = time.monotonic()
        N.nvmlDeviceCreateGpuInstance(self.dev, 19)
        self.assertGreaterEqual(time.monotonic() - t, 0.2)


class TestDcgmMapping(ShimCase):
    """DCGM exporter labels a GPU instance's metrics with the jobs its `<gpu>.<gi>` file
    lists: a GPU instance destroyed or made while such a file lists jobs is recorded."""

    def fixture_text(self):
        return 'dcgm_job_mapping_dir = "dcgm"\n' + DEFAULT_FIXTURE

    def test_a_mapping_left_behind_is_recorded(self):
        os.makedirs(os.path.join(self.dir, "dcgm"))
        gi = N.nvmlDeviceCreateGpuInstance(self.dev, 19)  # GPU 0, GI 13
        N.nvmlGpuInstanceDestroy(gi)
        self.assertNotIn("stale_dcgm_mappings", json.loads(self.ctl("show")))
        gi = N.nvmlDeviceCreateGpuInstance(self.dev, 19)
        with open(os.path.join(self.dir, "dcgm", "0.13"), "w") as f:
            f.write("4242\n")
        N.nvmlGpuInstanceDestroy(gi)
        stale = json.loads(self.ctl("show"))["stale_dcgm_mappings"]
        self.assertEqual(len(stale), 1)
        self.assertIn("0.13", stale[0])
        self.assertIn("4242", stale[0])
        N.nvmlDeviceCreateGpuInstance(self.dev, 19)  # the next GI 13 would get its jobs
        self.assertEqual(len(json.loads(self.ctl("show"))["stale_dcgm_mappings"]), 2)


@unittest.skipUnless(os.geteuid() == 0, "capability device nodes need root (mknod)")
class TestHolders(ShimCase):
    """A destroy answers NVML_ERROR_IN_USE while a process holds the instance's capability
    device open (nvml-shim-ctl hold), and succeeds once it lets go."""

    def fixture_text(self):
        return 'dev_dir = "dev"\ninstance_caps = true\n' + DEFAULT_FIXTURE

    def holder(self, *args):
        p = subprocess.Popen([CTL, "hold", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=os.environ.copy())
        line = p.stdout.readline()
        if not line.startswith(f"holding {p.pid} "):
            p.kill()
            self.fail(f"nvml-shim-ctl hold: {line}{p.stderr.read()}")
        return p

    def test_in_use_while_held(self):
        if not CTL:
            self.skipTest("NVML_SHIM_CTL not set")
        gi, ci = self.gi_with_ci()  # GPU 0, GI 13, CI 0
        p = self.holder("0", "13", "--ci", "0", "--name", "dcgm-exporter")
        try:
            with open(f"/proc/{p.pid}/comm") as f:
                self.assertEqual(f.read().strip(), "dcgm-exporter")
            ci_minor = 3 + 13 * 9 + 1
            held = [os.stat(f"/proc/{p.pid}/fd/{n}").st_rdev for n in os.listdir(f"/proc/{p.pid}/fd")]
            self.assertIn(os.makedev(508, ci_minor), held)
            with self.assertRaises(N.NVMLError_InUse):
                N.nvmlComputeInstanceDestroy(ci)
            with self.assertRaises(N.NVMLError_InUse):
                N.nvmlComputeInstanceDestroy(ci)
        finally:
            p.kill()
            p.wait()
        N.nvmlComputeInstanceDestroy(ci)
        N.nvmlGpuInstanceDestroy(gi)

    def test_a_holder_that_lets_go(self):
        if not CTL:
            self.skipTest("NVML_SHIM_CTL not set")
        gi = N.nvmlDeviceCreateGpuInstance(self.dev, 19)
        p = self.holder("0", "13", "--for-ms", "2000")
        with self.assertRaises(N.NVMLError_InUse):
            N.nvmlGpuInstanceDestroy(gi)
        p.wait(timeout=30)
        N.nvmlGpuInstanceDestroy(gi)
        self.assertNotIn("holders", json.loads(self.ctl("show")))


class CompareCase(ShimCase):
    """tools/compare-real-gpu.py, pointed at the shim as if it were the real GPU (no GPU is
    needed): it reads the driver version, MIG modes and CC state without changing them, sets
    the shim up the same way, and finds no difference. On a real GPU that is the check."""

    def compare(self):
        tool = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "compare-real-gpu.py")
        r = subprocess.run([sys.executable, tool, "--gpu", "0", "--real-lib", LIB,
                            "--shim-lib", LIB, "--json"],
                           capture_output=True, text=True, env=os.environ.copy(), timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)
        self.assertIn("no differences", r.stdout)
        return json.loads(r.stdout.split("\nreal GPU:")[0])["real"]


class TestCompareTool(CompareCase):
    FIXTURE = """
state = "state.json"
driver_version = "535.129.03"
[[gpus]]
model = "A100-80GB"
mig_mode = true
mig_mode_pending = false
"""

    def test_names_and_a_pending_mig_mode(self):
        real = self.compare()
        self.assertEqual(real["driver_version"], "535.129.03")
        self.assertEqual(real["mig_mode"], [1, 0])
        self.assertIn("MIG 3g.39gb", [p.get("name") for p in real["gi_profiles"].values()])
        self.assertEqual(real["cc"]["state"]["ccFeature"], 0)


class TestCompareToolCc(CompareCase):
    FIXTURE = """
state = "state.json"
[[gpus]]
model = "H200-141GB"
cc_mode = true
"""

    def test_cc_mode(self):
        cc = self.compare()["cc"]
        self.assertEqual(cc["state"]["ccFeature"], 1)
        self.assertGreater(cc["memory"]["protectedMemSizeKib"], 0)

if __name__ == "__main__":
    unittest.main()
