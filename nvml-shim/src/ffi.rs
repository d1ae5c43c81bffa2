//! The exported NVML C ABI.
#![allow(non_snake_case, non_camel_case_types, clippy::missing_safety_doc)]

use crate::config::{self, Config};
use crate::layout;
use crate::model::{self, GiProfile, GpuModel, GI_PROFILE_INDEX_COUNT};
use crate::ret::{self, NvmlResult, Ret};
use crate::state::{self, FaultSources, Faults, State};
use crate::store;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_uint, c_ulonglong, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard};

pub type nvmlReturn_t = c_uint;

// ---------------------------------------------------------------------------------------------
// C structs (nvml.h layouts)

#[repr(C)]
pub struct nvmlMemory_t {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

#[repr(C)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct nvmlGpuInstancePlacement_t {
    pub start: c_uint,
    pub size: c_uint,
}
pub type nvmlComputeInstancePlacement_t = nvmlGpuInstancePlacement_t;

pub const NAME_V2_LEN: usize = 96;

#[repr(C)]
pub struct nvmlGpuInstanceProfileInfo_t {
    pub id: c_uint,
    pub isP2pSupported: c_uint,
    pub sliceCount: c_uint,
    pub instanceCount: c_uint,
    pub multiprocessorCount: c_uint,
    pub copyEngineCount: c_uint,
    pub decoderCount: c_uint,
    pub encoderCount: c_uint,
    pub jpegCount: c_uint,
    pub ofaCount: c_uint,
    pub memorySizeMB: c_ulonglong,
}

#[repr(C)]
pub struct nvmlGpuInstanceProfileInfo_v2_t {
    pub version: c_uint,
    pub id: c_uint,
    pub isP2pSupported: c_uint,
    pub sliceCount: c_uint,
    pub instanceCount: c_uint,
    pub multiprocessorCount: c_uint,
    pub copyEngineCount: c_uint,
    pub decoderCount: c_uint,
    pub encoderCount: c_uint,
    pub jpegCount: c_uint,
    pub ofaCount: c_uint,
    pub memorySizeMB: c_ulonglong,
    pub name: [c_char; NAME_V2_LEN],
}

#[repr(C)]
pub struct nvmlGpuInstanceProfileInfo_v3_t {
    pub version: c_uint,
    pub id: c_uint,
    pub sliceCount: c_uint,
    pub instanceCount: c_uint,
    pub multiprocessorCount: c_uint,
    pub copyEngineCount: c_uint,
    pub decoderCount: c_uint,
    pub encoderCount: c_uint,
    pub jpegCount: c_uint,
    pub ofaCount: c_uint,
    pub memorySizeMB: c_ulonglong,
    pub name: [c_char; NAME_V2_LEN],
    pub capabilities: c_uint,
}

#[repr(C)]
pub struct nvmlGpuInstanceInfo_t {
    pub device: *mut DevH,
    pub id: c_uint,
    pub profileId: c_uint,
    pub placement: nvmlGpuInstancePlacement_t,
}

#[repr(C)]
pub struct nvmlComputeInstanceProfileInfo_t {
    pub id: c_uint,
    pub sliceCount: c_uint,
    pub instanceCount: c_uint,
    pub multiprocessorCount: c_uint,
    pub sharedCopyEngineCount: c_uint,
    pub sharedDecoderCount: c_uint,
    pub sharedEncoderCount: c_uint,
    pub sharedJpegCount: c_uint,
    pub sharedOfaCount: c_uint,
}

#[repr(C)]
pub struct nvmlComputeInstanceProfileInfo_v2_t {
    pub version: c_uint,
    pub id: c_uint,
    pub sliceCount: c_uint,
    pub instanceCount: c_uint,
    pub multiprocessorCount: c_uint,
    pub sharedCopyEngineCount: c_uint,
    pub sharedDecoderCount: c_uint,
    pub sharedEncoderCount: c_uint,
    pub sharedJpegCount: c_uint,
    pub sharedOfaCount: c_uint,
    pub name: [c_char; NAME_V2_LEN],
}

#[repr(C)]
pub struct nvmlComputeInstanceProfileInfo_v3_t {
    pub version: c_uint,
    pub id: c_uint,
    pub sliceCount: c_uint,
    pub instanceCount: c_uint,
    pub multiprocessorCount: c_uint,
    pub sharedCopyEngineCount: c_uint,
    pub sharedDecoderCount: c_uint,
    pub sharedEncoderCount: c_uint,
    pub sharedJpegCount: c_uint,
    pub sharedOfaCount: c_uint,
    pub name: [c_char; NAME_V2_LEN],
    pub capabilities: c_uint,
}

#[repr(C)]
pub struct nvmlComputeInstanceInfo_t {
    pub device: *mut DevH,
    pub gpuInstance: *mut GiH,
    pub id: c_uint,
    pub profileId: c_uint,
    pub placement: nvmlComputeInstancePlacement_t,
}

#[repr(C)]
pub struct nvmlConfComputeSystemState_t {
    pub environment: c_uint,
    pub ccFeature: c_uint,
    pub devToolsMode: c_uint,
}

#[repr(C)]
pub struct nvmlSystemConfComputeSettings_v1_t {
    pub version: c_uint,
    pub environment: c_uint,
    pub ccFeature: c_uint,
    pub devToolsMode: c_uint,
    pub multiGpuMode: c_uint,
}

#[repr(C)]
pub struct nvmlConfComputeSystemCaps_t {
    pub cpuCaps: c_uint,
    pub gpusCaps: c_uint,
}

#[repr(C)]
pub struct nvmlConfComputeMemSizeInfo_t {
    pub protectedMemSizeKib: c_ulonglong,
    pub unprotectedMemSizeKib: c_ulonglong,
}

// nvmlConfComputeSystemState_t and nvmlSystemConfComputeSettings_t values (nvml.h).
const NVML_CC_SYSTEM_ENVIRONMENT_UNAVAILABLE: c_uint = 0;
const NVML_CC_SYSTEM_ENVIRONMENT_PROD: c_uint = 2;
const NVML_CC_SYSTEM_FEATURE_DISABLED: c_uint = 0;
const NVML_CC_SYSTEM_FEATURE_ENABLED: c_uint = 1;
const NVML_CC_SYSTEM_CPU_CAPS_NONE: c_uint = 0;
const NVML_CC_SYSTEM_CPU_CAPS_INTEL_TDX: c_uint = 2;
const NVML_CC_SYSTEM_GPUS_CC_NOT_CAPABLE: c_uint = 0;
const NVML_CC_SYSTEM_GPUS_CC_CAPABLE: c_uint = 1;

/// NVML_STRUCT_VERSION(name, ver) = sizeof(struct) | ver << 24.
const fn struct_version<T>(ver: u32) -> u32 {
    std::mem::size_of::<T>() as u32 | (ver << 24)
}
pub const NVML_MEMORY_V2: u32 = struct_version::<nvmlMemory_v2_t>(2);
pub const NVML_GI_PROFILE_INFO_V2: u32 = struct_version::<nvmlGpuInstanceProfileInfo_v2_t>(2);
pub const NVML_GI_PROFILE_INFO_V3: u32 = struct_version::<nvmlGpuInstanceProfileInfo_v3_t>(3);
pub const NVML_CI_PROFILE_INFO_V2: u32 = struct_version::<nvmlComputeInstanceProfileInfo_v2_t>(2);
pub const NVML_CI_PROFILE_INFO_V3: u32 = struct_version::<nvmlComputeInstanceProfileInfo_v3_t>(3);
pub const NVML_SYSTEM_CONF_COMPUTE_SETTINGS_V1: u32 =
    struct_version::<nvmlSystemConfComputeSettings_v1_t>(1);

// Pinned against nvml.h / pynvml: nvmlGpuInstanceProfileInfo_v2 = 0x02000098,
// nvmlComputeInstanceProfileInfo_v2 = 0x02000088, nvmlMemory_v2 = 0x02000028.
const _: () = assert!(NVML_GI_PROFILE_INFO_V2 == 0x0200_0098);
const _: () = assert!(NVML_GI_PROFILE_INFO_V3 == 0x0300_0098);
const _: () = assert!(NVML_CI_PROFILE_INFO_V2 == 0x0200_0088);
const _: () = assert!(NVML_CI_PROFILE_INFO_V3 == 0x0300_008C);
const _: () = assert!(NVML_MEMORY_V2 == 0x0200_0028);
// pynvml: nvmlSystemConfComputeSettings_v1 = 0x1000014.
const _: () = assert!(NVML_SYSTEM_CONF_COMPUTE_SETTINGS_V1 == 0x0100_0014);

// ---------------------------------------------------------------------------------------------
// Handles: leaked boxes, registered by address so a foreign pointer is refused.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MigRef {
    pub gi: u32,
    pub gi_serial: u64,
    pub ci: u32,
    pub ci_serial: u64,
}

/// nvmlDevice_t: a physical GPU (mig None) or a MIG device.
#[derive(Debug)]
pub struct DevH {
    pub gpu: u32,
    pub mig: Option<MigRef>,
}

/// nvmlGpuInstance_t.
#[derive(Debug)]
pub struct GiH {
    pub gpu: u32,
    pub gi: u32,
    pub serial: u64,
}

/// nvmlComputeInstance_t.
#[derive(Debug)]
pub struct CiH {
    pub gpu: u32,
    pub gi: u32,
    pub gi_serial: u64,
    pub ci: u32,
    pub serial: u64,
}

#[derive(Default)]
struct Registry {
    devs: HashMap<(u32, Option<MigRef>), usize>,
    gis: HashMap<(u32, u32, u64), usize>,
    cis: HashMap<(u32, u32, u64, u32, u64), usize>,
    dev_ptrs: HashSet<usize>,
    gi_ptrs: HashSet<usize>,
    ci_ptrs: HashSet<usize>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn registry() -> MutexGuard<'static, Option<Registry>> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

fn dev_handle(gpu: u32, mig: Option<MigRef>) -> *mut DevH {
    let mut g = registry();
    let r = g.get_or_insert_with(Registry::default);
    if let Some(p) = r.devs.get(&(gpu, mig)) {
        return *p as *mut DevH;
    }
    let p = Box::into_raw(Box::new(DevH { gpu, mig })) as usize;
    r.devs.insert((gpu, mig), p);
    r.dev_ptrs.insert(p);
    p as *mut DevH
}

fn gi_handle(gpu: u32, gi: u32, serial: u64) -> *mut GiH {
    let mut g = registry();
    let r = g.get_or_insert_with(Registry::default);
    if let Some(p) = r.gis.get(&(gpu, gi, serial)) {
        return *p as *mut GiH;
    }
    let p = Box::into_raw(Box::new(GiH { gpu, gi, serial })) as usize;
    r.gis.insert((gpu, gi, serial), p);
    r.gi_ptrs.insert(p);
    p as *mut GiH
}

fn ci_handle(gpu: u32, gi: u32, gi_serial: u64, ci: u32, serial: u64) -> *mut CiH {
    let mut g = registry();
    let r = g.get_or_insert_with(Registry::default);
    let key = (gpu, gi, gi_serial, ci, serial);
    if let Some(p) = r.cis.get(&key) {
        return *p as *mut CiH;
    }
    let p = Box::into_raw(Box::new(CiH {
        gpu,
        gi,
        gi_serial,
        ci,
        serial,
    })) as usize;
    r.cis.insert(key, p);
    r.ci_ptrs.insert(p);
    p as *mut CiH
}

fn dev_ref(p: *mut DevH) -> NvmlResult<&'static DevH> {
    let ok = registry()
        .as_ref()
        .is_some_and(|r| r.dev_ptrs.contains(&(p as usize)));
    if !ok {
        return Err(Ret::INVALID_ARGUMENT);
    }
    // SAFETY: the address is one of our leaked, never-freed DevH boxes.
    Ok(unsafe { &*p })
}

fn gi_ref(p: *mut GiH) -> NvmlResult<&'static GiH> {
    let ok = registry()
        .as_ref()
        .is_some_and(|r| r.gi_ptrs.contains(&(p as usize)));
    if !ok {
        return Err(Ret::INVALID_ARGUMENT);
    }
    // SAFETY: the address is one of our leaked, never-freed GiH boxes.
    Ok(unsafe { &*p })
}

fn ci_ref(p: *mut CiH) -> NvmlResult<&'static CiH> {
    let ok = registry()
        .as_ref()
        .is_some_and(|r| r.ci_ptrs.contains(&(p as usize)));
    if !ok {
        return Err(Ret::INVALID_ARGUMENT);
    }
    // SAFETY: the address is one of our leaked, never-freed CiH boxes.
    Ok(unsafe { &*p })
}

// ---------------------------------------------------------------------------------------------
// Runtime (per process): configuration, init refcount, process-local faults.

struct Runtime {
    cfg: Arc<Config>,
    refcount: u32,
    local_faults: Faults,
}

static RUNTIME: Mutex<Option<Runtime>> = Mutex::new(None);

fn runtime() -> MutexGuard<'static, Option<Runtime>> {
    RUNTIME.lock().unwrap_or_else(|p| p.into_inner())
}

fn store_err(e: store::StoreError) -> Ret {
    eprintln!("nvml-shim: {e}");
    Ret::UNKNOWN
}

/// Runs `f` with the configuration of an initialized library.
fn with_cfg<T>(f: impl FnOnce(&Config) -> NvmlResult<T>) -> NvmlResult<T> {
    let cfg = runtime()
        .as_ref()
        .map(|r| r.cfg.clone())
        .ok_or(Ret::UNINITIALIZED)?;
    f(&cfg)
}

/// Reads a consistent snapshot.
fn read<T>(f: impl FnOnce(&Config, &State) -> NvmlResult<T>) -> NvmlResult<T> {
    with_cfg(|cfg| store::read(cfg, |st| f(cfg, st)).map_err(store_err)?)
}

/// Read-modify-write; device nodes follow the new state before it is committed.
fn modify<T>(f: impl FnOnce(&Config, &mut State, &mut Faults) -> NvmlResult<T>) -> NvmlResult<T> {
    let mut rt = runtime();
    let rt = rt.as_mut().ok_or(Ret::UNINITIALIZED)?;
    let cfg = rt.cfg.clone();
    let local = &mut rt.local_faults;
    let out = store::modify(
        &cfg,
        |st| (f(&cfg, st, local), true),
        |st| layout::sync_caps(&cfg, st),
    );
    match out {
        Ok(r) => r,
        Err(e) => {
            eprintln!("nvml-shim: {e}");
            Err(Ret::OPERATING_SYSTEM)
        }
    }
}

fn check_gpu(cfg: &Config, st: &State, gpu: u32) -> NvmlResult<()> {
    st.gpu(gpu)?;
    if cfg.env_lost.contains(&gpu) {
        return Err(Ret::GPU_IS_LOST);
    }
    Ok(())
}

fn call(f: impl FnOnce() -> NvmlResult<()>) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ret::SUCCESS,
        Ok(Err(r)) => r.0,
        Err(_) => Ret::UNKNOWN.0,
    }
}

/// Waits out the delay armed for creates (`create`) or destroys: this process's own
/// (NVML_SHIM_FAULTS) or the shared state's, whichever is longer. Slept before the call takes
/// the state lock, so a slow or hung call holds up its own caller only, as a driver call does.
fn pause(create: bool) -> NvmlResult<()> {
    let pick = |f: &Faults| {
        if create {
            f.create_delay_ms
        } else {
            f.destroy_delay_ms
        }
    };
    let local = runtime()
        .as_ref()
        .map(|r| pick(&r.local_faults))
        .ok_or(Ret::UNINITIALIZED)?;
    let shared = read(|_, st| Ok(pick(&st.faults)))?;
    let ms = local.max(shared);
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    Ok(())
}

/// The jobs DCGM exporter's mapping file `<gpu>.<gi>` lists (fixture `dcgm_job_mapping_dir`),
/// with the file's path, when it lists any.
fn dcgm_listing(cfg: &Config, gpu: u32, gi: u32) -> Option<String> {
    let path = cfg.dcgm_mapping_dir.as_ref()?.join(format!("{gpu}.{gi}"));
    let text = std::fs::read_to_string(&path).ok()?;
    let jobs: Vec<&str> = text.split_whitespace().collect();
    (!jobs.is_empty()).then(|| format!("{} (job(s) {})", path.display(), jobs.join(",")))
}

/// Records what DCGM exporter would mislabel: a GPU instance made or destroyed while the
/// mapping file of its id still lists jobs (the exporter labels whatever instance has that id).
fn dcgm_stale(st: &mut State, gpu: u32, gi: u32, what: &str, listing: Option<String>) {
    if let Some(l) = listing {
        st.stale_dcgm_mappings.push(format!(
            "GPU instance {gpu}.{gi} {what} while {l} still named it: DCGM exporter labels \
             the metrics of GPU instance {gi} of GPU {gpu} with those jobs"
        ));
    }
}

fn out<T>(p: *mut T) -> NvmlResult<&'static mut T> {
    if p.is_null() {
        return Err(Ret::INVALID_ARGUMENT);
    }
    // SAFETY: non-null pointer to caller-owned storage of type T, as the NVML API requires.
    Ok(unsafe { &mut *p })
}

fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> NvmlResult<()> {
    if buf.is_null() {
        return Err(Ret::INVALID_ARGUMENT);
    }
    let b = s.as_bytes();
    if (len as usize) < b.len() + 1 {
        return Err(Ret::INSUFFICIENT_SIZE);
    }
    // SAFETY: caller guarantees `len` writable bytes at `buf`; we write b.len()+1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(b.as_ptr(), buf as *mut u8, b.len());
        *buf.add(b.len()) = 0;
    }
    Ok(())
}

fn name_field(s: &str) -> [c_char; NAME_V2_LEN] {
    let mut a = [0 as c_char; NAME_V2_LEN];
    for (i, b) in s.bytes().take(NAME_V2_LEN - 1).enumerate() {
        a[i] = b as c_char;
    }
    a
}

/// A physical GPU handle that exists and is not lost.
fn physical(cfg: &Config, st: &State, d: *mut DevH) -> NvmlResult<(u32, GpuModel)> {
    let h = dev_ref(d)?;
    check_gpu(cfg, st, h.gpu)?;
    if h.mig.is_some() {
        return Err(Ret::INVALID_ARGUMENT);
    }
    Ok((h.gpu, st.gpu(h.gpu)?.model))
}

fn gi_of(cfg: &Config, st: &State, g: *mut GiH) -> NvmlResult<&'static GiH> {
    let h = gi_ref(g)?;
    check_gpu(cfg, st, h.gpu)?;
    st.gi(h.gpu, h.gi, h.serial)?;
    Ok(h)
}

fn ci_of(cfg: &Config, st: &State, c: *mut CiH) -> NvmlResult<&'static CiH> {
    let h = ci_ref(c)?;
    check_gpu(cfg, st, h.gpu)?;
    st.ci(h.gpu, h.gi, h.gi_serial, h.ci, h.serial)?;
    Ok(h)
}

fn gi_profile_for_index(model: GpuModel, index: u32) -> NvmlResult<&'static GiProfile> {
    if index >= GI_PROFILE_INDEX_COUNT {
        return Err(Ret::INVALID_ARGUMENT);
    }
    model.gi_profile_by_index(index).ok_or(Ret::NOT_SUPPORTED)
}

// ---------------------------------------------------------------------------------------------
// Init / shutdown / strings

fn init(_flags: c_uint) -> NvmlResult<()> {
    let mut rt = runtime();
    if let Some(r) = rt.as_mut() {
        r.refcount += 1;
        return Ok(());
    }
    let cfg = Config::from_env().map_err(|e| {
        eprintln!("nvml-shim: nvmlInit failed: {e}");
        Ret::UNKNOWN
    })?;
    let lays_out = cfg.dev_dir.is_some() || cfg.mig_minors.is_some() || cfg.proc_devices.is_some();
    // A layout the files still show is not made again (the driver, too, makes its nodes once,
    // not at every nvmlInit). The read also checks the state file, as every init does.
    let laid_out =
        store::read(&cfg, |st| lays_out && layout::is_current(&cfg, st)).map_err(store_err)?;
    if lays_out && !laid_out {
        // Under the exclusive lock, so concurrent inits do not race on mknod.
        store::modify(&cfg, |st| (layout::layout(&cfg, st), true), |_| Ok(()))
            .and_then(|r| r)
            .map_err(|e| {
                eprintln!("nvml-shim: nvmlInit failed: {e}");
                Ret::OPERATING_SYSTEM
            })?;
    }
    let local_faults = cfg.env_faults.clone();
    *rt = Some(Runtime {
        cfg: Arc::new(cfg),
        refcount: 1,
        local_faults,
    });
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t {
    call(|| init(flags))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    call(|| init(0))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInit() -> nvmlReturn_t {
    call(|| init(0))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    call(|| {
        let mut rt = runtime();
        let r = rt.as_mut().ok_or(Ret::UNINITIALIZED)?;
        r.refcount -= 1;
        if r.refcount == 0 {
            *rt = None;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    ret::message(result).as_ptr() as *const c_char
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    call(|| with_cfg(|cfg| put_str(version, length, &cfg.driver_version)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    call(|| {
        let v = runtime()
            .as_ref()
            .map(|r| r.cfg.nvml_version())
            .unwrap_or_else(|| format!("12.{}", config::DEFAULT_DRIVER_VERSION));
        put_str(version, length, &v)
    })
}

// ---------------------------------------------------------------------------------------------
// Devices

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    call(|| {
        let c = out(count)?;
        *c = with_cfg(|cfg| Ok(cfg.gpus.len() as u32))?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> nvmlReturn_t {
    unsafe { nvmlDeviceGetCount_v2(count) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut *mut DevH,
) -> nvmlReturn_t {
    call(|| {
        let o = out(device)?;
        read(|cfg, st| check_gpu(cfg, st, index))?;
        *o = dev_handle(index, None);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut *mut DevH,
) -> nvmlReturn_t {
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut *mut DevH,
) -> nvmlReturn_t {
    call(|| {
        if uuid.is_null() {
            return Err(Ret::INVALID_ARGUMENT);
        }
        let o = out(device)?;
        // SAFETY: caller passes a NUL-terminated string.
        let want = unsafe { CStr::from_ptr(uuid) }
            .to_string_lossy()
            .into_owned();
        let h = read(|cfg, st| {
            for (i, g) in st.gpus.iter().enumerate() {
                let i = i as u32;
                if g.uuid == want {
                    check_gpu(cfg, st, i)?;
                    return Ok(dev_handle(i, None));
                }
                for gi in &g.gis {
                    for ci in &gi.cis {
                        if config::mig_uuid(&g.uuid, gi.id, ci.id) == want {
                            check_gpu(cfg, st, i)?;
                            return Ok(dev_handle(
                                i,
                                Some(MigRef {
                                    gi: gi.id,
                                    gi_serial: gi.serial,
                                    ci: ci.id,
                                    ci_serial: ci.serial,
                                }),
                            ));
                        }
                    }
                }
            }
            Err(Ret::NOT_FOUND)
        })?;
        *o = h;
        Ok(())
    })
}

/// (gpu index, model, the MIG device's GI and CI if it is one).
type AnyDev = (u32, GpuModel, Option<(state::GiState, state::CiState)>);

/// Resolves any device handle: (gpu, model, MIG (gi, ci) if a MIG device).
fn any_dev(cfg: &Config, st: &State, d: *mut DevH) -> NvmlResult<AnyDev> {
    let h = dev_ref(d)?;
    check_gpu(cfg, st, h.gpu)?;
    let model = st.gpu(h.gpu)?.model;
    match h.mig {
        None => Ok((h.gpu, model, None)),
        Some(m) => {
            let gi = st.gi(h.gpu, m.gi, m.gi_serial)?.clone();
            let ci = st.ci(h.gpu, m.gi, m.gi_serial, m.ci, m.ci_serial)?.clone();
            Ok((h.gpu, model, Some((gi, ci))))
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: *mut DevH,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    call(|| {
        let s = read(|cfg, st| {
            let (_, model, mig) = any_dev(cfg, st, device)?;
            Ok(match mig {
                None => model.product_name().to_string(),
                Some((gi, ci)) => {
                    let gp = state::gi_profile_of(model, &gi)?;
                    let gpu = dev_ref(device)?.gpu;
                    let cp =
                        ci_profile_named(cfg, gpu, model, gp, ci.profile_id).ok_or(Ret::UNKNOWN)?;
                    format!("{} {}", model.product_name(), cp.name)
                }
            })
        })?;
        put_str(name, length, &s)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: *mut DevH,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    call(|| {
        let s = read(|cfg, st| {
            let (gpu, _, mig) = any_dev(cfg, st, device)?;
            let g = st.gpu(gpu)?;
            Ok(match mig {
                None => g.uuid.clone(),
                Some((gi, ci)) => config::mig_uuid(&g.uuid, gi.id, ci.id),
            })
        })?;
        put_str(uuid, length, &s)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: *mut DevH,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let o = out(minor)?;
        *o = read(|cfg, st| {
            let (gpu, _, mig) = any_dev(cfg, st, device)?;
            if mig.is_some() {
                return Err(Ret::NOT_SUPPORTED);
            }
            Ok(gpu)
        })?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: *mut DevH, index: *mut c_uint) -> nvmlReturn_t {
    call(|| {
        let o = out(index)?;
        *o = read(|cfg, st| {
            let (gpu, _, mig) = any_dev(cfg, st, device)?;
            if mig.is_some() {
                return Err(Ret::NOT_SUPPORTED);
            }
            Ok(gpu)
        })?;
        Ok(())
    })
}

/// (total, used) bytes of a device handle.
fn memory(cfg: &Config, st: &State, device: *mut DevH) -> NvmlResult<(u64, u64)> {
    let (gpu, model, mig) = any_dev(cfg, st, device)?;
    match mig {
        Some((gi, _)) => {
            let gp = state::gi_profile_of(model, &gi)?;
            Ok((gp.memory_mb << 20, 0))
        }
        None => {
            let g = st.gpu(gpu)?;
            let used: u64 = g
                .gis
                .iter()
                .filter_map(|x| model.gi_profile_by_id(x.profile_id))
                .map(|p| p.memory_mb << 20)
                .sum();
            Ok((model.memory_total_bytes(), used))
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: *mut DevH,
    memory_out: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    call(|| {
        let o = out(memory_out)?;
        let (total, used) = read(|cfg, st| memory(cfg, st, device))?;
        *o = nvmlMemory_t {
            total,
            free: total - used,
            used,
        };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: *mut DevH,
    memory_out: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    call(|| {
        let o = out(memory_out)?;
        if o.version != NVML_MEMORY_V2 {
            return Err(Ret::ARGUMENT_VERSION_MISMATCH);
        }
        let (total, used) = read(|cfg, st| memory(cfg, st, device))?;
        o.total = total;
        o.reserved = 0;
        o.used = used;
        o.free = total - used;
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// MIG mode and GPU instance profiles

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: *mut DevH,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let c = out(current)?;
        let p = out(pending)?;
        let (cur, pen) = read(|cfg, st| {
            let (gpu, _) = physical(cfg, st, device).map_err(|e| {
                if e == Ret::INVALID_ARGUMENT && dev_ref(device).is_ok() {
                    Ret::NOT_SUPPORTED
                } else {
                    e
                }
            })?;
            let g = st.gpu(gpu)?;
            Ok((g.mig_mode as u32, g.pending_mig_mode as u32))
        })?;
        *c = cur;
        *p = pen;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(
    device: *mut DevH,
    mode: c_uint,
    activation_status: *mut nvmlReturn_t,
) -> nvmlReturn_t {
    call(|| {
        let a = out(activation_status)?;
        if mode > 1 {
            return Err(Ret::INVALID_ARGUMENT);
        }
        *a = modify(|cfg, st, _| {
            let (gpu, _) = physical(cfg, st, device)?;
            st.set_mig_mode(gpu, mode == 1)
        })?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: *mut DevH,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    call(|| {
        let o = out(info)?;
        let p = read(|cfg, st| {
            let (_, model) = physical(cfg, st, device)?;
            gi_profile_for_index(model, profile)
        })?;
        *o = nvmlGpuInstanceProfileInfo_t {
            id: p.id,
            isP2pSupported: 0,
            sliceCount: p.compute_slices,
            instanceCount: p.instance_count,
            multiprocessorCount: p.sm,
            copyEngineCount: p.copy_engines,
            decoderCount: p.decoders,
            encoderCount: p.encoders,
            jpegCount: p.jpegs,
            ofaCount: p.ofas,
            memorySizeMB: p.memory_mb,
        };
        Ok(())
    })
}

/// The name GPU `gpu`'s driver gives profile `p` (fixture `profile_names`, driver release).
fn gi_name(cfg: &Config, gpu: u32, p: &GiProfile) -> String {
    cfg.gpus
        .get(gpu as usize)
        .map(|g| g.profile_name(p).to_string())
        .unwrap_or_else(|| p.name.to_string())
}

/// A CI profile of a GI of profile `gp` on GPU `gpu`, named as that GPU's driver names it.
fn ci_profile_named(
    cfg: &Config,
    gpu: u32,
    model: GpuModel,
    gp: &GiProfile,
    index: u32,
) -> Option<model::CiProfile> {
    let mut cp = model::ci_profile(model, gp, index)?;
    let name = gi_name(cfg, gpu, gp);
    if name != gp.name {
        cp.name = cp.name.replace(gp.name, &name);
    }
    Some(cp)
}

/// Writes a v2 or v3 GI profile info (chosen by the caller's version field).
fn write_gi_profile_v(
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
    p: &GiProfile,
    version: u32,
    name: &str,
) {
    let name = name_field(&format!("MIG {name}"));
    if version == NVML_GI_PROFILE_INFO_V3 {
        // SAFETY: the caller declared (version field) a v3 struct at this address.
        let o = unsafe { &mut *(info as *mut nvmlGpuInstanceProfileInfo_v3_t) };
        o.id = p.id;
        o.sliceCount = p.compute_slices;
        o.instanceCount = p.instance_count;
        o.multiprocessorCount = p.sm;
        o.copyEngineCount = p.copy_engines;
        o.decoderCount = p.decoders;
        o.encoderCount = p.encoders;
        o.jpegCount = p.jpegs;
        o.ofaCount = p.ofas;
        o.memorySizeMB = p.memory_mb;
        o.name = name;
        o.capabilities = 0;
    } else {
        // SAFETY: non-null, version checked to be v2.
        let o = unsafe { &mut *info };
        o.id = p.id;
        o.isP2pSupported = 0;
        o.sliceCount = p.compute_slices;
        o.instanceCount = p.instance_count;
        o.multiprocessorCount = p.sm;
        o.copyEngineCount = p.copy_engines;
        o.decoderCount = p.decoders;
        o.encoderCount = p.encoders;
        o.jpegCount = p.jpegs;
        o.ofaCount = p.ofas;
        o.memorySizeMB = p.memory_mb;
        o.name = name;
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: *mut DevH,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    call(|| {
        if info.is_null() {
            return Err(Ret::INVALID_ARGUMENT);
        }
        // SAFETY: non-null; every versioned struct starts with its u32 version.
        let version = unsafe { *(info as *const c_uint) };
        let (p, name) = read(|cfg, st| {
            let (gpu, model) = physical(cfg, st, device)?;
            if version != NVML_GI_PROFILE_INFO_V2 && version != NVML_GI_PROFILE_INFO_V3 {
                return Err(Ret::ARGUMENT_VERSION_MISMATCH);
            }
            let p = gi_profile_for_index(model, profile)?;
            Ok((p, gi_name(cfg, gpu, p)))
        })?;
        write_gi_profile_v(info, p, version, &name);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoByIdV(
    device: *mut DevH,
    profile_id: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    call(|| {
        if info.is_null() {
            return Err(Ret::INVALID_ARGUMENT);
        }
        // SAFETY: non-null; every versioned struct starts with its u32 version.
        let version = unsafe { *(info as *const c_uint) };
        let (p, name) = read(|cfg, st| {
            let (gpu, model) = physical(cfg, st, device)?;
            if version != NVML_GI_PROFILE_INFO_V2 && version != NVML_GI_PROFILE_INFO_V3 {
                return Err(Ret::ARGUMENT_VERSION_MISMATCH);
            }
            let p = model
                .gi_profile_by_id(profile_id)
                .ok_or(Ret::INVALID_ARGUMENT)?;
            Ok((p, gi_name(cfg, gpu, p)))
        })?;
        write_gi_profile_v(info, p, version, &name);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: *mut DevH,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let c = out(count)?;
        let p = read(|cfg, st| {
            let (_, model) = physical(cfg, st, device)?;
            model
                .gi_profile_by_id(profile_id)
                .ok_or(Ret::INVALID_ARGUMENT)
        })?;
        let n = p.placements.len() as u32;
        if placements.is_null() {
            *c = n;
            return Ok(());
        }
        if *c < n {
            *c = n;
            return Err(Ret::INSUFFICIENT_SIZE);
        }
        for (i, s) in p.placements.iter().enumerate() {
            // SAFETY: caller provided room for *c >= n placements.
            unsafe {
                *placements.add(i) = nvmlGpuInstancePlacement_t {
                    start: *s,
                    size: p.memory_slices,
                }
            };
        }
        *c = n;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    device: *mut DevH,
    profile_id: c_uint,
    count: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let c = out(count)?;
        *c = read(|cfg, st| {
            let (gpu, _) = physical(cfg, st, device)?;
            st.gi_remaining_capacity(gpu, profile_id)
        })?;
        Ok(())
    })
}

fn create_gi(
    device: *mut DevH,
    profile_id: u32,
    placement: Option<(u32, u32)>,
) -> NvmlResult<*mut GiH> {
    pause(true)?;
    let (gpu, id, serial) = modify(|cfg, st, local| {
        let (gpu, _) = physical(cfg, st, device)?;
        let (id, serial) = st.create_gi(
            gpu,
            profile_id,
            placement,
            FaultSources { local: Some(local) },
        )?;
        dcgm_stale(st, gpu, id, "made", dcgm_listing(cfg, gpu, id));
        Ok((gpu, id, serial))
    })?;
    Ok(gi_handle(gpu, id, serial))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstance(
    device: *mut DevH,
    profile_id: c_uint,
    gpu_instance: *mut *mut GiH,
) -> nvmlReturn_t {
    call(|| {
        let o = out(gpu_instance)?;
        *o = create_gi(device, profile_id, None)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: *mut DevH,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    gpu_instance: *mut *mut GiH,
) -> nvmlReturn_t {
    call(|| {
        let o = out(gpu_instance)?;
        if placement.is_null() {
            return Err(Ret::INVALID_ARGUMENT);
        }
        // SAFETY: non-null pointer to a caller placement.
        let pl = unsafe { std::ptr::read_unaligned(placement) };
        *o = create_gi(device, profile_id, Some((pl.start, pl.size)))?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(gpu_instance: *mut GiH) -> nvmlReturn_t {
    call(|| {
        pause(false)?;
        modify(|cfg, st, local| {
            let h = gi_of(cfg, st, gpu_instance)?;
            let held = crate::holders::held(cfg, st, h.gpu, h.gi, None);
            let listing = dcgm_listing(cfg, h.gpu, h.gi);
            st.destroy_gi(
                h.gpu,
                h.gi,
                h.serial,
                FaultSources { local: Some(local) },
                held,
            )?;
            dcgm_stale(st, h.gpu, h.gi, "destroyed", listing);
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: *mut DevH,
    profile_id: c_uint,
    gpu_instances: *mut *mut GiH,
    count: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let c = out(count)?;
        if gpu_instances.is_null() {
            return Err(Ret::INVALID_ARGUMENT);
        }
        let list = read(|cfg, st| {
            let (gpu, model) = physical(cfg, st, device)?;
            let g = st.gpu(gpu)?;
            if !g.mig_mode {
                return Err(Ret::NOT_SUPPORTED);
            }
            model
                .gi_profile_by_id(profile_id)
                .ok_or(Ret::INVALID_ARGUMENT)?;
            Ok(g.gis
                .iter()
                .filter(|x| x.profile_id == profile_id)
                .map(|x| (gpu, x.id, x.serial))
                .collect::<Vec<_>>())
        })?;
        for (i, (gpu, id, serial)) in list.iter().enumerate() {
            // SAFETY: NVML requires room for the profile's instanceCount handles; the list
            // never exceeds it.
            unsafe { *gpu_instances.add(i) = gi_handle(*gpu, *id, *serial) };
        }
        *c = list.len() as u32;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: *mut DevH,
    id: c_uint,
    gpu_instance: *mut *mut GiH,
) -> nvmlReturn_t {
    call(|| {
        let o = out(gpu_instance)?;
        let (gpu, serial) = read(|cfg, st| {
            let (gpu, _) = physical(cfg, st, device)?;
            let g = st.gpu(gpu)?;
            if !g.mig_mode {
                return Err(Ret::NOT_SUPPORTED);
            }
            let gi = g.gis.iter().find(|x| x.id == id).ok_or(Ret::NOT_FOUND)?;
            Ok((gpu, gi.serial))
        })?;
        *o = gi_handle(gpu, id, serial);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpu_instance: *mut GiH,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    call(|| {
        let o = out(info)?;
        let (gpu, gi) = read(|cfg, st| {
            let h = gi_of(cfg, st, gpu_instance)?;
            Ok((h.gpu, st.gi(h.gpu, h.gi, h.serial)?.clone()))
        })?;
        *o = nvmlGpuInstanceInfo_t {
            device: dev_handle(gpu, None),
            id: gi.id,
            profileId: gi.profile_id,
            placement: nvmlGpuInstancePlacement_t {
                start: gi.start,
                size: gi.size,
            },
        };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Compute instances

fn ci_profile_of(
    cfg: &Config,
    st: &State,
    g: *mut GiH,
    profile: u32,
    eng: u32,
) -> NvmlResult<model::CiProfile> {
    let h = gi_of(cfg, st, g)?;
    if profile >= model::CI_PROFILE_INDEX_COUNT || eng >= model::CI_ENGINE_PROFILE_COUNT {
        return Err(Ret::INVALID_ARGUMENT);
    }
    let m = st.gpu(h.gpu)?.model;
    let gp = state::gi_profile_of(m, st.gi(h.gpu, h.gi, h.serial)?)?;
    ci_profile_named(cfg, h.gpu, m, gp, profile).ok_or(Ret::NOT_SUPPORTED)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gpu_instance: *mut GiH,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    call(|| {
        let o = out(info)?;
        let p = read(|cfg, st| ci_profile_of(cfg, st, gpu_instance, profile, eng_profile))?;
        *o = nvmlComputeInstanceProfileInfo_t {
            id: p.id,
            sliceCount: p.compute_slices,
            instanceCount: p.instance_count,
            multiprocessorCount: p.sm,
            sharedCopyEngineCount: p.copy_engines,
            sharedDecoderCount: p.decoders,
            sharedEncoderCount: p.encoders,
            sharedJpegCount: p.jpegs,
            sharedOfaCount: p.ofas,
        };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gpu_instance: *mut GiH,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    call(|| {
        if info.is_null() {
            return Err(Ret::INVALID_ARGUMENT);
        }
        // SAFETY: non-null; versioned structs start with their u32 version.
        let version = unsafe { *(info as *const c_uint) };
        let p = read(|cfg, st| {
            gi_of(cfg, st, gpu_instance)?;
            if version != NVML_CI_PROFILE_INFO_V2 && version != NVML_CI_PROFILE_INFO_V3 {
                return Err(Ret::ARGUMENT_VERSION_MISMATCH);
            }
            ci_profile_of(cfg, st, gpu_instance, profile, eng_profile)
        })?;
        // SAFETY: version checked; v3 extends v2 by a trailing u32.
        let o = unsafe { &mut *info };
        o.id = p.id;
        o.sliceCount = p.compute_slices;
        o.instanceCount = p.instance_count;
        o.multiprocessorCount = p.sm;
        o.sharedCopyEngineCount = p.copy_engines;
        o.sharedDecoderCount = p.decoders;
        o.sharedEncoderCount = p.encoders;
        o.sharedJpegCount = p.jpegs;
        o.sharedOfaCount = p.ofas;
        o.name = name_field(&p.name);
        if version == NVML_CI_PROFILE_INFO_V3 {
            // SAFETY: the caller declared a v3 struct.
            unsafe { (*(info as *mut nvmlComputeInstanceProfileInfo_v3_t)).capabilities = 0 };
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    gpu_instance: *mut GiH,
    profile_id: c_uint,
    count: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let c = out(count)?;
        *c = read(|cfg, st| {
            let h = gi_of(cfg, st, gpu_instance)?;
            ci_profile_of(cfg, st, gpu_instance, profile_id, 0)?;
            st.ci_remaining_capacity(h.gpu, h.gi, h.serial, profile_id)
        })?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    gpu_instance: *mut GiH,
    profile_id: c_uint,
    placements: *mut nvmlComputeInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let c = out(count)?;
        let p = read(|cfg, st| ci_profile_of(cfg, st, gpu_instance, profile_id, 0))?;
        let n = p.placements.len() as u32;
        if placements.is_null() {
            *c = n;
            return Ok(());
        }
        if *c < n {
            *c = n;
            return Err(Ret::INSUFFICIENT_SIZE);
        }
        for (i, s) in p.placements.iter().enumerate() {
            // SAFETY: caller provided room for *c >= n placements.
            unsafe {
                *placements.add(i) = nvmlComputeInstancePlacement_t {
                    start: *s,
                    size: p.compute_slices,
                }
            };
        }
        *c = n;
        Ok(())
    })
}

fn create_ci(
    gpu_instance: *mut GiH,
    profile_id: u32,
    placement: Option<(u32, u32)>,
) -> NvmlResult<*mut CiH> {
    pause(true)?;
    let (h, id, serial) = modify(|cfg, st, local| {
        let h = gi_of(cfg, st, gpu_instance)?;
        ci_profile_of(cfg, st, gpu_instance, profile_id, 0)?;
        let (id, serial) = st.create_ci(
            h.gpu,
            h.gi,
            h.serial,
            profile_id,
            placement,
            FaultSources { local: Some(local) },
        )?;
        Ok((h, id, serial))
    })?;
    Ok(ci_handle(h.gpu, h.gi, h.serial, id, serial))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gpu_instance: *mut GiH,
    profile_id: c_uint,
    compute_instance: *mut *mut CiH,
) -> nvmlReturn_t {
    call(|| {
        let o = out(compute_instance)?;
        *o = create_ci(gpu_instance, profile_id, None)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    gpu_instance: *mut GiH,
    profile_id: c_uint,
    placement: *const nvmlComputeInstancePlacement_t,
    compute_instance: *mut *mut CiH,
) -> nvmlReturn_t {
    call(|| {
        let o = out(compute_instance)?;
        if placement.is_null() {
            return Err(Ret::INVALID_ARGUMENT);
        }
        // SAFETY: non-null pointer to a caller placement.
        let pl = unsafe { std::ptr::read_unaligned(placement) };
        *o = create_ci(gpu_instance, profile_id, Some((pl.start, pl.size)))?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceDestroy(compute_instance: *mut CiH) -> nvmlReturn_t {
    call(|| {
        pause(false)?;
        modify(|cfg, st, local| {
            let h = ci_of(cfg, st, compute_instance)?;
            let held = crate::holders::held(cfg, st, h.gpu, h.gi, Some(h.ci));
            st.destroy_ci(
                h.gpu,
                h.gi,
                h.gi_serial,
                h.ci,
                h.serial,
                FaultSources { local: Some(local) },
                held,
            )
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gpu_instance: *mut GiH,
    profile_id: c_uint,
    compute_instances: *mut *mut CiH,
    count: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let c = out(count)?;
        if compute_instances.is_null() {
            return Err(Ret::INVALID_ARGUMENT);
        }
        let (h, list) = read(|cfg, st| {
            let h = gi_of(cfg, st, gpu_instance)?;
            ci_profile_of(cfg, st, gpu_instance, profile_id, 0).map_err(|e| {
                if e == Ret::NOT_SUPPORTED {
                    Ret::INVALID_ARGUMENT
                } else {
                    e
                }
            })?;
            let gi = st.gi(h.gpu, h.gi, h.serial)?;
            Ok((
                h,
                gi.cis
                    .iter()
                    .filter(|c| c.profile_id == profile_id)
                    .map(|c| (c.id, c.serial))
                    .collect::<Vec<_>>(),
            ))
        })?;
        for (i, (id, serial)) in list.iter().enumerate() {
            // SAFETY: NVML requires room for the CI profile's instanceCount handles.
            unsafe { *compute_instances.add(i) = ci_handle(h.gpu, h.gi, h.serial, *id, *serial) };
        }
        *c = list.len() as u32;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpu_instance: *mut GiH,
    id: c_uint,
    compute_instance: *mut *mut CiH,
) -> nvmlReturn_t {
    call(|| {
        let o = out(compute_instance)?;
        let (h, serial) = read(|cfg, st| {
            let h = gi_of(cfg, st, gpu_instance)?;
            let gi = st.gi(h.gpu, h.gi, h.serial)?;
            let ci = gi.cis.iter().find(|c| c.id == id).ok_or(Ret::NOT_FOUND)?;
            Ok((h, ci.serial))
        })?;
        *o = ci_handle(h.gpu, h.gi, h.serial, id, serial);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    compute_instance: *mut CiH,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    call(|| {
        let o = out(info)?;
        let (h, ci) = read(|cfg, st| {
            let h = ci_of(cfg, st, compute_instance)?;
            Ok((h, st.ci(h.gpu, h.gi, h.gi_serial, h.ci, h.serial)?.clone()))
        })?;
        *o = nvmlComputeInstanceInfo_t {
            device: dev_handle(h.gpu, None),
            gpuInstance: gi_handle(h.gpu, h.gi, h.gi_serial),
            id: ci.id,
            profileId: ci.profile_id,
            placement: nvmlComputeInstancePlacement_t {
                start: ci.start,
                size: ci.size,
            },
        };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo(
    compute_instance: *mut CiH,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    unsafe { nvmlComputeInstanceGetInfo_v2(compute_instance, info) }
}

// ---------------------------------------------------------------------------------------------
// Confidential computing: NVML reports it for the system (nvmlSystemGetConfComputeState;
// NVIDIA supports no node with some GPUs in CC mode and others not), and per GPU the memory
// it protects. The stand-in keeps a mode per GPU (fixture `cc_mode`, `nvml-shim-ctl cc`): the
// system state is on when any visible GPU is, and only such a GPU reports protected memory.

/// Whether any GPU that answers is in CC mode.
fn cc_on(cfg: &Config, st: &State) -> bool {
    (0..st.gpus.len() as u32).any(|i| check_gpu(cfg, st, i).is_ok() && st.gpus[i as usize].cc_mode)
}

fn hopper(model: GpuModel) -> bool {
    matches!(model, GpuModel::H100_80GB | GpuModel::H200_141GB)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetConfComputeState(
    state: *mut nvmlConfComputeSystemState_t,
) -> nvmlReturn_t {
    call(|| {
        let o = out(state)?;
        let on = read(|cfg, st| Ok(cc_on(cfg, st)))?;
        *o = nvmlConfComputeSystemState_t {
            environment: if on {
                NVML_CC_SYSTEM_ENVIRONMENT_PROD
            } else {
                NVML_CC_SYSTEM_ENVIRONMENT_UNAVAILABLE
            },
            ccFeature: if on {
                NVML_CC_SYSTEM_FEATURE_ENABLED
            } else {
                NVML_CC_SYSTEM_FEATURE_DISABLED
            },
            devToolsMode: 0,
        };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetConfComputeSettings(
    settings: *mut nvmlSystemConfComputeSettings_v1_t,
) -> nvmlReturn_t {
    call(|| {
        let o = out(settings)?;
        if o.version != NVML_SYSTEM_CONF_COMPUTE_SETTINGS_V1 {
            return Err(Ret::ARGUMENT_VERSION_MISMATCH);
        }
        let on = read(|cfg, st| Ok(cc_on(cfg, st)))?;
        o.environment = if on {
            NVML_CC_SYSTEM_ENVIRONMENT_PROD
        } else {
            NVML_CC_SYSTEM_ENVIRONMENT_UNAVAILABLE
        };
        o.ccFeature = on as c_uint;
        o.devToolsMode = 0;
        o.multiGpuMode = 0;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetConfComputeCapabilities(
    caps: *mut nvmlConfComputeSystemCaps_t,
) -> nvmlReturn_t {
    call(|| {
        let o = out(caps)?;
        let (on, capable) = read(|cfg, st| {
            Ok((
                cc_on(cfg, st),
                !st.gpus.is_empty() && st.gpus.iter().all(|g| hopper(g.model)),
            ))
        })?;
        *o = nvmlConfComputeSystemCaps_t {
            cpuCaps: if on {
                NVML_CC_SYSTEM_CPU_CAPS_INTEL_TDX
            } else {
                NVML_CC_SYSTEM_CPU_CAPS_NONE
            },
            gpusCaps: if capable {
                NVML_CC_SYSTEM_GPUS_CC_CAPABLE
            } else {
                NVML_CC_SYSTEM_GPUS_CC_NOT_CAPABLE
            },
        };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetConfComputeMemSizeInfo(
    device: *mut DevH,
    info: *mut nvmlConfComputeMemSizeInfo_t,
) -> nvmlReturn_t {
    call(|| {
        let o = out(info)?;
        let total = read(|cfg, st| {
            let (gpu, model) = physical(cfg, st, device)?;
            if !hopper(model) || !st.gpu(gpu)?.cc_mode {
                return Err(Ret::NOT_SUPPORTED);
            }
            Ok(model.memory_total_bytes())
        })?;
        *o = nvmlConfComputeMemSizeInfo_t {
            protectedMemSizeKib: total >> 10,
            unprotectedMemSizeKib: 0,
        };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// MIG device handles

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: *mut DevH,
    count: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let c = out(count)?;
        *c = read(|cfg, st| {
            let (gpu, _) = physical(cfg, st, device)?;
            Ok(if st.gpu(gpu)?.mig_mode {
                model::MAX_MIG_DEVICES
            } else {
                0
            })
        })?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: *mut DevH,
    index: c_uint,
    mig_device: *mut *mut DevH,
) -> nvmlReturn_t {
    call(|| {
        let o = out(mig_device)?;
        let (gpu, m) = read(|cfg, st| {
            let (gpu, _) = physical(cfg, st, device)?;
            if !st.gpu(gpu)?.mig_mode {
                return Err(Ret::NOT_SUPPORTED);
            }
            if index >= model::MAX_MIG_DEVICES {
                return Err(Ret::INVALID_ARGUMENT);
            }
            let list = st.mig_devices(gpu)?;
            let (gi, ci) = list.get(index as usize).ok_or(Ret::NOT_FOUND)?;
            Ok((
                gpu,
                MigRef {
                    gi: gi.id,
                    gi_serial: gi.serial,
                    ci: ci.id,
                    ci_serial: ci.serial,
                },
            ))
        })?;
        *o = dev_handle(gpu, Some(m));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: *mut DevH,
    device: *mut *mut DevH,
) -> nvmlReturn_t {
    call(|| {
        let o = out(device)?;
        let gpu = read(|cfg, st| {
            let (gpu, _, mig) = any_dev(cfg, st, mig_device)?;
            mig.ok_or(Ret::INVALID_ARGUMENT)?;
            Ok(gpu)
        })?;
        *o = dev_handle(gpu, None);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: *mut DevH,
    is_mig: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let o = out(is_mig)?;
        with_cfg(|_| Ok(()))?;
        *o = dev_ref(device)?.mig.is_some() as c_uint;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: *mut DevH,
    id: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let o = out(id)?;
        *o = read(|cfg, st| {
            let (_, _, mig) = any_dev(cfg, st, device)?;
            Ok(mig.ok_or(Ret::NOT_SUPPORTED)?.0.id)
        })?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: *mut DevH,
    id: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let o = out(id)?;
        *o = read(|cfg, st| {
            let (_, _, mig) = any_dev(cfg, st, device)?;
            Ok(mig.ok_or(Ret::NOT_SUPPORTED)?.1.id)
        })?;
        Ok(())
    })
}
