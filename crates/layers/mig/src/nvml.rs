//! The NVML side: raw GI/CI calls through nvml-wrapper's symbol table.

use crate::choose::{choose_in, GiView, GpuView};
use crate::error::{At, MigError, Result};
use crate::plan::{PlanGpu, Slot};
use crate::profiles::{GpuModel, MigProfile};
use crate::{MigIntent, MigSlice, Occupant, Outcome, Request, Teardown};
use nvml_wrapper::error::nvml_sym;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings as b;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;

const DEFAULT_LIB: &str = "libnvidia-ml.so.1";
const SUCCESS: u32 = b::nvmlReturn_enum_NVML_SUCCESS;
const NOT_FOUND: u32 = b::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const INVALID_ARGUMENT: u32 = b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const IN_USE: u32 = b::nvmlReturn_enum_NVML_ERROR_IN_USE;
const INSUFFICIENT_RESOURCES: u32 = b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
const NOT_SUPPORTED: u32 = b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const CI_ENGINE_SHARED: u32 = b::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED;

/// Bounded retry of destroy calls answered NVML_ERROR_IN_USE: at most `attempts` calls and
/// `budget_ms` of waiting between them, the wait doubling from `backoff_ms` (at most 250 ms).
/// A holder that lets go within the budget (a monitoring agent between two samples, a job's
/// process that was just killed) costs a retry; one that does not fails the teardown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub backoff_ms: u64,
    #[serde(default = "default_budget_ms")]
    pub budget_ms: u64,
}

fn default_budget_ms() -> u64 {
    2_000
}

/// The longest single wait between two destroy attempts.
const MAX_BACKOFF_MS: u64 = 250;

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 30,
            backoff_ms: 20,
            budget_ms: default_budget_ms(),
        }
    }
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub minor: u32,
    pub mig_enabled: bool,
    pub mig_pending: bool,
    pub model: Option<GpuModel>,
    /// Fell off the bus (NVML_ERROR_GPU_IS_LOST): nothing else of it could be read.
    #[serde(default)]
    pub lost: bool,
    /// In confidential-computing mode: no MIG instance can be made on it.
    #[serde(default)]
    pub cc_mode: bool,
    /// Why no slice may be made on this GPU now (lost, CC mode, a MIG mode change waiting for
    /// a reset), when one of those holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unusable: Option<String>,
}

/// What NVML says of confidential computing on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CcState {
    /// Off, or a driver without the API (no CC-capable GPU).
    Off,
    On,
    /// The query failed: every GPU is treated as in CC mode (fail closed).
    Unknown(String),
}

/// An open NVML session.
pub struct Mig {
    nvml: Nvml,
    lib: String,
    plan: Option<Vec<Slot>>,
    pub retry: RetryPolicy,
}

fn code_name(code: u32) -> String {
    let e: nvml_wrapper::error::NvmlError = code.into();
    match code {
        INSUFFICIENT_RESOURCES => "INSUFFICIENT_RESOURCES".into(),
        _ => format!("{e}"),
    }
}

fn hint_for(code: u32, op: &str) -> String {
    match code {
        INSUFFICIENT_RESOURCES => "the placement is taken or the GPU is full: Slurm and the node disagree; run `tenancyctl reconcile` and drain the node until it is clean".into(),
        b::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => "NVML refused the MIG operation: run as root (mig-config capability)".into(),
        NOT_SUPPORTED => "this GPU/driver does not support it: check MIG mode and the driver version".into(),
        b::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => "the GPU fell off the bus: drain the node and check `nvidia-smi`/dmesg".into(),
        _ => format!("{op} failed; check `nvidia-smi mig -lgi` and the driver log, then run `tenancyctl reconcile`"),
    }
}

const GPU_IS_LOST: u32 = b::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;

/// Why no slice is made on a GPU that fell off the bus.
pub fn lost_reason(gpu: u32) -> String {
    format!(
        "GPU {gpu} fell off the bus (NVML_ERROR_GPU_IS_LOST, Xid 79 in dmesg): no MIG slice is \
         made on it; drain the node, check `nvidia-smi` and dmesg, and reboot or reset the GPU"
    )
}

fn nvml_err(at: At, op: &'static str, code: u32) -> MigError {
    MigError::Nvml {
        at,
        op,
        code,
        nvml: code_name(code),
        hint: hint_for(code, op),
    }
}

fn sym_err(at: At, op: &'static str, e: nvml_wrapper::error::NvmlError) -> MigError {
    MigError::Nvml {
        at,
        op,
        code: b::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND,
        nvml: e.to_string(),
        hint: "the NVML library lacks this MIG function: update the NVIDIA driver".into(),
    }
}

/// Call a raw NVML function: `call!(self, at, "op", nvmlFoo, args...)` -> Result<u32 code>.
macro_rules! raw {
    ($self:ident, $at:expr, $op:literal, $f:ident $(, $arg:expr)* ) => {{
        match nvml_sym($self.nvml.lib().$f.as_ref()) {
            Ok(f) => Ok(unsafe { f($($arg),*) }),
            Err(e) => Err(sym_err($at.clone(), $op, e)),
        }
    }};
}

/// `raw!` for calls where any return code but SUCCESS is an error naming the call.
macro_rules! checked {
    ($self:ident, $at:expr, $op:literal, $f:ident $(, $arg:expr)* ) => {{
        let rc = raw!($self, $at, $op, $f $(, $arg)*)?;
        if rc != SUCCESS {
            return Err(nvml_err($at.clone(), $op, rc));
        }
    }};
}

fn cstr(buf: &[std::os::raw::c_char]) -> String {
    // SAFETY-free: copy bytes up to the first NUL.
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Mig {
    /// Load NVML from `lib` (default "libnvidia-ml.so.1") and initialise it.
    pub fn open(lib: Option<&Path>) -> Result<Mig> {
        let lib_s = lib
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| DEFAULT_LIB.to_string());
        let mut builder = Nvml::builder();
        if let Some(p) = lib {
            builder.lib_path(p.as_os_str());
        }
        let nvml = builder.init().map_err(|e| MigError::Open {
            lib: lib_s.clone(),
            nvml: e.to_string(),
        })?;
        Ok(Mig {
            nvml,
            lib: lib_s,
            plan: None,
            retry: RetryPolicy::default(),
        })
    }

    /// The library this session loaded.
    pub fn library(&self) -> &str {
        &self.lib
    }

    /// Give the node's plan (output of [`crate::plan_slots`]); `choose` then places into it.
    pub fn set_plan(&mut self, slots: Vec<Slot>) {
        self.plan = Some(slots);
    }

    pub fn plan(&self) -> Option<&[Slot]> {
        self.plan.as_deref()
    }

    fn device(&self, index: u32) -> Result<(b::nvmlDevice_t, At)> {
        let at = At {
            gpu: Some(index),
            ..Default::default()
        };
        let d = self
            .nvml
            .device_by_index(index)
            .map_err(|e| MigError::Other {
                at: at.clone(),
                msg: format!("cannot get the device handle: {e}; check `nvidia-smi -L`"),
            })?;
        // SAFETY: the handle stays valid while self.nvml is initialised.
        Ok((unsafe { d.handle() }, at))
    }

    fn device_by_uuid(&self, uuid: &str, index_hint: u32) -> Result<(b::nvmlDevice_t, u32, At)> {
        let at = At {
            gpu: Some(index_hint),
            uuid: Some(uuid.to_string()),
            ..Default::default()
        };
        let d = self.nvml.device_by_uuid(uuid).map_err(|e| MigError::Other {
            at: at.clone(),
            msg: match e {
                nvml_wrapper::error::NvmlError::GpuLost => format!(
                    "{} (NVML_ERROR_GPU_IS_LOST); the slice stays journaled until it is back",
                    lost_reason(index_hint)
                ),
                e => format!("no GPU with this UUID: {e}; was the GPU replaced? check `nvidia-smi -L`, then `tenancyctl reconcile`"),
            },
        })?;
        let index = d.index().unwrap_or(index_hint);
        let at = At {
            gpu: Some(index),
            ..at
        };
        // SAFETY: as above.
        Ok((unsafe { d.handle() }, index, at))
    }

    /// Confidential computing on this node (nvmlSystemGetConfComputeState).
    fn cc_state(&self) -> CcState {
        let Ok(f) = nvml_sym(self.nvml.lib().nvmlSystemGetConfComputeState.as_ref()) else {
            // A driver from before CC: no GPU of it can be in CC mode.
            return CcState::Off;
        };
        // SAFETY: POD out-parameter.
        let mut st: b::nvmlConfComputeSystemState_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out pointer, as nvml.h asks.
        match unsafe { f(&mut st) } {
            SUCCESS if st.ccFeature == b::NVML_CC_SYSTEM_FEATURE_ENABLED => CcState::On,
            SUCCESS | NOT_SUPPORTED => CcState::Off,
            rc => CcState::Unknown(format!(
                "nvmlSystemGetConfComputeState failed: NVML {} (code {rc})",
                code_name(rc)
            )),
        }
    }

    /// Whether GPU `dev` protects memory for confidential computing, with the system state
    /// on: NVML reports CC for the system; a GPU that does not say otherwise counts as in CC
    /// mode (NVIDIA supports no node with some GPUs in CC mode and others not).
    /// `Ok(Some(MiB))`: in CC mode, protecting that much; `Ok(None)`: the GPU protects no
    /// memory (NOT_SUPPORTED, or none), so it is not in CC mode; `Err`: it could not say.
    fn cc_protected_mib(&self, dev: b::nvmlDevice_t) -> std::result::Result<Option<u64>, String> {
        let Ok(f) = nvml_sym(self.nvml.lib().nvmlDeviceGetConfComputeMemSizeInfo.as_ref()) else {
            return Err("nvmlDeviceGetConfComputeMemSizeInfo is missing".into());
        };
        // SAFETY: POD out-parameter.
        let mut m: b::nvmlConfComputeMemSizeInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a device handle of this session and a valid out pointer.
        match unsafe { f(dev, &mut m) } {
            SUCCESS if m.protectedMemSizeKib > 0 => Ok(Some(m.protectedMemSizeKib >> 10)),
            SUCCESS | NOT_SUPPORTED => Ok(None),
            rc => Err(format!(
                "nvmlDeviceGetConfComputeMemSizeInfo failed: NVML {} (code {rc})",
                code_name(rc)
            )),
        }
    }

    /// Why GPU `dev` counts as in confidential-computing mode, with the node's CC state `cc`;
    /// None: it does not. A GPU that cannot say counts as in CC mode (fail closed).
    fn cc_reason(&self, cc: &CcState, dev: b::nvmlDevice_t) -> Option<String> {
        match cc {
            CcState::Off => None,
            CcState::On => match self.cc_protected_mib(dev) {
                Ok(Some(mib)) => Some(format!("{mib} MiB of protected memory")),
                Ok(None) => None,
                Err(e) => Some(format!("the node's CC state is on and {e}")),
            },
            CcState::Unknown(e) => Some(format!("its CC mode cannot be read: {e}")),
        }
    }

    /// All GPUs on the node. A GPU that fell off the bus is listed (lost, with what is known:
    /// its index), as is one in confidential-computing mode or with a MIG mode change waiting
    /// for a reset: each names why no slice may be made on it (`unusable`).
    pub fn gpus(&self) -> Result<Vec<GpuInfo>> {
        let n = self.nvml.device_count().map_err(|e| MigError::Other {
            at: At::default(),
            msg: format!("cannot count GPUs: {e}"),
        })?;
        let cc = self.cc_state();
        let mut out = Vec::new();
        let lost = |i: u32| GpuInfo {
            index: i,
            uuid: String::new(),
            name: String::new(),
            minor: i,
            mig_enabled: false,
            mig_pending: false,
            model: None,
            lost: true,
            cc_mode: false,
            unusable: Some(lost_reason(i)),
        };
        for i in 0..n {
            let at = At {
                gpu: Some(i),
                ..Default::default()
            };
            let d = match self.nvml.device_by_index(i) {
                Ok(d) => d,
                Err(nvml_wrapper::error::NvmlError::GpuLost) => {
                    out.push(lost(i));
                    continue;
                }
                Err(e) => {
                    return Err(MigError::Other {
                        at: at.clone(),
                        msg: format!("cannot get the device: {e}"),
                    })
                }
            };
            let err = |what: &str, e: nvml_wrapper::error::NvmlError| MigError::Other {
                at: at.clone(),
                msg: format!("cannot read {what}: {e}"),
            };
            macro_rules! read {
                ($what:literal, $e:expr) => {
                    match $e {
                        Ok(v) => v,
                        Err(nvml_wrapper::error::NvmlError::GpuLost) => {
                            out.push(lost(i));
                            continue;
                        }
                        Err(e) => return Err(err($what, e)),
                    }
                };
            }
            let uuid = read!("UUID", d.uuid());
            let name = read!("name", d.name());
            let minor = read!("minor number", d.minor_number());
            let (current, pending) = read!(
                "MIG mode",
                match d.mig_mode() {
                    Ok(m) => Ok((m.current == 1, m.pending == 1)),
                    Err(nvml_wrapper::error::NvmlError::NotSupported) => Ok((false, false)),
                    Err(e) => Err(e),
                }
            );
            // SAFETY: the handle stays valid while self.nvml is initialised.
            let raw = unsafe { d.handle() };
            let cc_why = self.cc_reason(&cc, raw);
            let cc_mode = cc_why.is_some();
            let unusable = if let Some(why) = cc_why {
                Some(format!(
                    "GPU {i} ({uuid}) is in confidential-computing mode ({why}): MIG slices \
                     cannot be made on it; turn CC mode off (nvidia_gpu_tools.py \
                     --set-cc-mode=off, then reset the GPU) or take it out of the MIG plan"
                ))
            } else if current && !pending {
                Some(format!(
                    "GPU {i} ({uuid}) has a MIG mode change pending a GPU reset (current \
                     enabled, pending disabled): an administrator is taking it out of MIG; \
                     reset it (`nvidia-smi -r -i {i}`) or set MIG mode back (`nvidia-smi -i {i} \
                     -mig 1`) before slices are made on it again"
                ))
            } else {
                None
            };
            out.push(GpuInfo {
                index: i,
                uuid,
                model: GpuModel::from_nvml_name(&name),
                name,
                minor,
                mig_enabled: current,
                mig_pending: pending,
                lost: false,
                cc_mode,
                unusable,
            });
        }
        Ok(out)
    }

    /// Input for [`crate::plan_slots`]: the node's MIG-enabled GPUs of known models. A GPU of an
    /// unknown model or with MIG disabled is an error (fail closed) when `strict`.
    pub fn plan_gpus(&self, strict: bool) -> Result<Vec<PlanGpu>> {
        let mut out = Vec::new();
        for g in self.gpus()? {
            if g.lost && strict {
                // Its model is unknown, and the plan's slots are numbered over every GPU.
                return Err(MigError::Refused {
                    reason: format!(
                        "{}; its model cannot be read, so the node's MIG plan slots (gres.conf) \
                         cannot be laid out: no MIG job starts on this node until it is back",
                        lost_reason(g.index)
                    ),
                });
            }
            match (g.model, g.mig_enabled) {
                (Some(model), true) => out.push(PlanGpu {
                    index: g.index,
                    minor: g.minor,
                    model,
                }),
                (None, _) if strict => {
                    return Err(MigError::UnknownModel {
                        gpu: g.index,
                        name: g.name,
                    })
                }
                (Some(_), false) if strict => {
                    return Err(MigError::MigDisabled {
                        gpu: g.index,
                        uuid: g.uuid,
                        state: if g.mig_pending {
                            "pending (reset needed)"
                        } else {
                            "disabled"
                        }
                        .into(),
                    })
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// The driver's version (nvmlSystemGetDriverVersion), or "?" when it cannot be read.
    pub fn driver_version(&self) -> String {
        self.nvml
            .sys_driver_version()
            .unwrap_or_else(|_| "?".into())
    }

    /// Every GPU instance profile of every GPU of a known model, as its driver names it
    /// (the `name` of nvmlGpuInstanceProfileInfo_v2, without "MIG "). Lost GPUs and GPUs of
    /// unknown models are left out.
    pub fn driver_names(&self) -> Result<Vec<crate::DriverNames>> {
        let mut out = Vec::new();
        for g in self.gpus()? {
            let Some(model) = g.model.filter(|_| !g.lost) else {
                continue;
            };
            let (dev, at) = self.device(g.index)?;
            let mut names = Vec::new();
            for idx in 0..b::NVML_GPU_INSTANCE_PROFILE_COUNT {
                if let Ok(info) = self.gi_profile_info(dev, idx, &at) {
                    let name = cstr(&info.name);
                    let name = name.strip_prefix("MIG ").unwrap_or(&name).to_string();
                    if !names.iter().any(|(id, _)| *id == info.id) {
                        names.push((info.id, name));
                    }
                }
            }
            out.push(crate::DriverNames {
                gpu: g.index,
                gpu_name: g.name,
                model,
                names,
            });
        }
        Ok(out)
    }

    /// GI profile ids to scan on a GPU.
    fn gi_profile_ids(
        &self,
        dev: b::nvmlDevice_t,
        model: Option<GpuModel>,
        at: &At,
    ) -> Result<Vec<u32>> {
        if let Some(m) = model {
            return Ok(m.profiles().iter().map(|p| p.gi_profile_id).collect());
        }
        let mut ids = Vec::new();
        for idx in 0..b::NVML_GPU_INSTANCE_PROFILE_COUNT {
            if let Ok(info) = self.gi_profile_info(dev, idx, at) {
                if !ids.contains(&info.id) {
                    ids.push(info.id);
                }
            }
        }
        Ok(ids)
    }

    fn gi_profile_info(
        &self,
        dev: b::nvmlDevice_t,
        index: u32,
        at: &At,
    ) -> Result<b::nvmlGpuInstanceProfileInfo_v2_t> {
        // SAFETY: plain-old-data C struct.
        let mut info: b::nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
        info.version = std::mem::size_of::<b::nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (2 << 24);
        checked!(
            self,
            at,
            "nvmlDeviceGetGpuInstanceProfileInfoV",
            nvmlDeviceGetGpuInstanceProfileInfoV,
            dev,
            index,
            &mut info
        );
        Ok(info)
    }

    fn list_gis(
        &self,
        dev: b::nvmlDevice_t,
        profile_id: u32,
        at: &At,
    ) -> Result<Vec<b::nvmlGpuInstance_t>> {
        let mut buf: Vec<b::nvmlGpuInstance_t> = vec![std::ptr::null_mut(); 32];
        let mut count: u32 = 0;
        let rc = raw!(
            self,
            at,
            "nvmlDeviceGetGpuInstances",
            nvmlDeviceGetGpuInstances,
            dev,
            profile_id,
            buf.as_mut_ptr(),
            &mut count
        )?;
        match rc {
            SUCCESS => {
                buf.truncate((count as usize).min(32));
                Ok(buf)
            }
            // A profile this GPU does not offer has no instances.
            NOT_SUPPORTED | INVALID_ARGUMENT | NOT_FOUND => Ok(Vec::new()),
            _ => Err(nvml_err(at.clone(), "nvmlDeviceGetGpuInstances", rc)),
        }
    }

    fn gi_info(&self, gi: b::nvmlGpuInstance_t, at: &At) -> Result<b::nvmlGpuInstanceInfo_t> {
        // SAFETY: POD.
        let mut info: b::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        checked!(
            self,
            at,
            "nvmlGpuInstanceGetInfo",
            nvmlGpuInstanceGetInfo,
            gi,
            &mut info
        );
        Ok(info)
    }

    fn ci_profile_info(
        &self,
        gi: b::nvmlGpuInstance_t,
        index: u32,
        at: &At,
    ) -> std::result::Result<b::nvmlComputeInstanceProfileInfo_v2_t, (u32, Option<MigError>)> {
        // SAFETY: POD.
        let mut info: b::nvmlComputeInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
        info.version =
            std::mem::size_of::<b::nvmlComputeInstanceProfileInfo_v2_t>() as u32 | (2 << 24);
        let rc = raw!(
            self,
            at,
            "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
            nvmlGpuInstanceGetComputeInstanceProfileInfoV,
            gi,
            index,
            CI_ENGINE_SHARED,
            &mut info
        )
        .map_err(|e| (0, Some(e)))?;
        if rc != SUCCESS {
            return Err((rc, None));
        }
        Ok(info)
    }

    /// All CIs of a GI (handles and ids).
    fn list_cis(
        &self,
        gi: b::nvmlGpuInstance_t,
        at: &At,
    ) -> Result<Vec<(b::nvmlComputeInstance_t, u32)>> {
        let mut out = Vec::new();
        let mut ids_seen = Vec::new();
        for idx in 0..b::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            let info = match self.ci_profile_info(gi, idx, at) {
                Ok(i) => i,
                Err((_, Some(e))) => return Err(e),
                Err((_, None)) => continue,
            };
            if ids_seen.contains(&info.id) {
                continue;
            }
            ids_seen.push(info.id);
            let mut buf: Vec<b::nvmlComputeInstance_t> = vec![std::ptr::null_mut(); 16];
            let mut count: u32 = 0;
            let rc = raw!(
                self,
                at,
                "nvmlGpuInstanceGetComputeInstances",
                nvmlGpuInstanceGetComputeInstances,
                gi,
                info.id,
                buf.as_mut_ptr(),
                &mut count
            )?;
            match rc {
                SUCCESS => {}
                NOT_SUPPORTED | INVALID_ARGUMENT | NOT_FOUND => continue,
                _ => {
                    return Err(nvml_err(
                        at.clone(),
                        "nvmlGpuInstanceGetComputeInstances",
                        rc,
                    ))
                }
            }
            for &ci in buf.iter().take((count as usize).min(16)) {
                // SAFETY: POD.
                let mut ci_info: b::nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
                checked!(
                    self,
                    at,
                    "nvmlComputeInstanceGetInfo_v2",
                    nvmlComputeInstanceGetInfo_v2,
                    ci,
                    &mut ci_info
                );
                out.push((ci, ci_info.id));
            }
        }
        Ok(out)
    }

    fn gis_of(
        &self,
        dev: b::nvmlDevice_t,
        model: Option<GpuModel>,
        at: &At,
    ) -> Result<Vec<(b::nvmlGpuInstance_t, b::nvmlGpuInstanceInfo_t)>> {
        let mut out = Vec::new();
        for pid in self.gi_profile_ids(dev, model, at)? {
            for gi in self.list_gis(dev, pid, at)? {
                let info = self.gi_info(gi, at)?;
                out.push((gi, info));
            }
        }
        out.sort_by_key(|(_, i)| i.id);
        Ok(out)
    }

    /// Every GPU with its GIs and their CIs (for reconcile and for choose).
    pub fn instances(&self) -> Result<Vec<GpuView>> {
        let mut out = Vec::new();
        for g in self.gpus()? {
            let mut view = GpuView {
                index: g.index,
                uuid: g.uuid.clone(),
                minor: g.minor,
                name: g.name.clone(),
                model: g.model,
                mig_enabled: g.mig_enabled,
                instances: Vec::new(),
                unusable: g.unusable.clone(),
            };
            if g.mig_enabled && !g.lost {
                let (dev, at) = self.device(g.index)?;
                let at = At {
                    uuid: Some(g.uuid.clone()),
                    ..at
                };
                for (gi, info) in self.gis_of(dev, g.model, &at)? {
                    let at_gi = At {
                        gi: Some(info.id),
                        ..at.clone()
                    };
                    let mut ci_ids: Vec<u32> = self
                        .list_cis(gi, &at_gi)?
                        .into_iter()
                        .map(|(_, id)| id)
                        .collect();
                    ci_ids.sort_unstable();
                    view.instances.push(GiView {
                        gi_id: info.id,
                        profile_id: info.profileId,
                        start: info.placement.start,
                        size: info.placement.size,
                        ci_ids,
                    });
                }
            }
            out.push(view);
        }
        Ok(out)
    }

    /// Pick GPU and placement for a request (see [`choose_in`]). Occupancy comes from NVML;
    /// `occupants` (other live jobs' journals, read under the node lock) gives tenants.
    pub fn choose(&self, req: &Request, occupants: &[Occupant]) -> Result<MigIntent> {
        let views = self.instances()?;
        choose_in(&views, self.plan.as_deref(), req, occupants)
    }

    fn profile_for(&self, intent: &MigIntent, name: &str, at: &At) -> Result<&'static MigProfile> {
        let model = GpuModel::from_nvml_name(name).ok_or_else(|| MigError::UnknownModel {
            gpu: intent.gpu_index,
            name: name.to_string(),
        })?;
        let p = model
            .profile(&intent.profile)
            .ok_or_else(|| MigError::UnknownProfile {
                profile: intent.profile.clone(),
                model: model.to_string(),
                known: model
                    .profiles()
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        if p.gi_profile_id != intent.gi_profile_id
            || p.memory_slices != intent.placement_size
            || !p.starts.contains(&intent.placement_start)
        {
            return Err(MigError::Other {
                at: at.clone(),
                msg: format!(
                    "intent does not match the {model} table (profile {} is GI profile id {}, size {}, starts {:?}); the journal is corrupt or from another node: do not create, run `tenancyctl reconcile`",
                    p.name, p.gi_profile_id, p.memory_slices, p.starts
                ),
            });
        }
        Ok(p)
    }

    /// Create the GI at the intent's placement, then its full-size CI. If the CI cannot be
    /// made (or its MIG device cannot be found), the GI is destroyed before the error returns.
    pub fn create(&self, intent: &MigIntent) -> Result<MigSlice> {
        let (dev, gpu_index, at) = self.device_by_uuid(&intent.gpu_uuid, intent.gpu_index)?;
        let at = At {
            profile: Some(intent.profile.clone()),
            placement: Some((intent.placement_start, intent.placement_size)),
            ..at
        };
        let d = self
            .nvml
            .device_by_index(gpu_index)
            .map_err(|e| MigError::Other {
                at: at.clone(),
                msg: format!("cannot get device: {e}"),
            })?;
        let name = d.name().map_err(|e| MigError::Other {
            at: at.clone(),
            msg: format!("cannot read name: {e}"),
        })?;
        let minor = d.minor_number().map_err(|e| MigError::Other {
            at: at.clone(),
            msg: format!("cannot read minor: {e}"),
        })?;
        match d.mig_mode() {
            Ok(m) if m.current == 1 && m.pending == 1 => {}
            Ok(m) if m.current == 1 => {
                return Err(MigError::Refused {
                    reason: format!(
                        "GPU {gpu_index} ({}) has a MIG mode change pending a GPU reset \
                         (current enabled, pending disabled): no slice is made on it",
                        intent.gpu_uuid
                    ),
                })
            }
            Ok(m) => {
                return Err(MigError::MigDisabled {
                    gpu: gpu_index,
                    uuid: intent.gpu_uuid.clone(),
                    state: if m.pending == 1 {
                        "pending (reset needed)".into()
                    } else {
                        "disabled".into()
                    },
                })
            }
            Err(e) => {
                return Err(MigError::Other {
                    at,
                    msg: format!("cannot read MIG mode: {e}"),
                })
            }
        }
        // SAFETY: the handle stays valid while self.nvml is initialised.
        if let Some(why) = self.cc_reason(&self.cc_state(), unsafe { d.handle() }) {
            return Err(MigError::Refused {
                reason: format!(
                    "GPU {gpu_index} ({}) is in confidential-computing mode ({why}): no slice is \
                     made on it",
                    intent.gpu_uuid
                ),
            });
        }
        let p = self.profile_for(intent, &name, &at)?;
        let pinfo = self.gi_profile_info(dev, p.gi_profile_index, &at)?;
        if pinfo.id != p.gi_profile_id {
            return Err(MigError::Other {
                at,
                msg: format!(
                    "NVML says profile index {} is GI profile id {}, the table says {}: driver and table disagree; do not create, report this",
                    p.gi_profile_index, pinfo.id, p.gi_profile_id
                ),
            });
        }
        let placement = b::nvmlGpuInstancePlacement_t {
            start: intent.placement_start,
            size: intent.placement_size,
        };
        let mut gi: b::nvmlGpuInstance_t = std::ptr::null_mut();
        checked!(
            self,
            at,
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            nvmlDeviceCreateGpuInstanceWithPlacement,
            dev,
            pinfo.id,
            &placement,
            &mut gi
        );
        let gi_info = match self.gi_info(gi, &at) {
            Ok(i) => i,
            Err(e) => return Err(self.undo_gi(gi, &at, e)),
        };
        let at = At {
            gi: Some(gi_info.id),
            ..at
        };

        // Full-size CI.
        let ci_pinfo = match self.full_ci_profile(gi, p, pinfo.sliceCount, &at) {
            Ok(i) => i,
            Err(e) => return Err(self.undo_gi(gi, &at, e)),
        };
        let mut ci: b::nvmlComputeInstance_t = std::ptr::null_mut();
        let rc = match raw!(
            self,
            at,
            "nvmlGpuInstanceCreateComputeInstance",
            nvmlGpuInstanceCreateComputeInstance,
            gi,
            ci_pinfo.id,
            &mut ci
        ) {
            Ok(rc) => rc,
            Err(e) => return Err(self.undo_gi(gi, &at, e)),
        };
        if rc != SUCCESS {
            return Err(self.undo_gi(
                gi,
                &at,
                nvml_err(at.clone(), "nvmlGpuInstanceCreateComputeInstance", rc),
            ));
        }
        // SAFETY: POD.
        let mut ci_info: b::nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
        let rc = match raw!(
            self,
            at,
            "nvmlComputeInstanceGetInfo_v2",
            nvmlComputeInstanceGetInfo_v2,
            ci,
            &mut ci_info
        ) {
            Ok(rc) => rc,
            Err(e) => return Err(self.undo_all(gi, &at, e)),
        };
        if rc != SUCCESS {
            return Err(self.undo_all(
                gi,
                &at,
                nvml_err(at.clone(), "nvmlComputeInstanceGetInfo_v2", rc),
            ));
        }
        let at = At {
            ci: Some(ci_info.id),
            ..at
        };
        let mig_uuid = match self.mig_uuid(dev, gi_info.id, ci_info.id, &at) {
            Ok(u) => u,
            Err(e) => return Err(self.undo_all(gi, &at, e)),
        };
        Ok(MigSlice {
            gpu_index,
            gpu_minor: minor,
            gpu_uuid: intent.gpu_uuid.clone(),
            gi_id: gi_info.id,
            ci_id: ci_info.id,
            mig_uuid,
        })
    }

    /// The compute-instance profile that covers the whole GI: `slices` compute slices (the GI
    /// profile's sliceCount), asked of NVML. The table's index (the plain
    /// NVML_COMPUTE_INSTANCE_PROFILE_<N>_SLICE of the GI's size) comes first; only the plain
    /// N_SLICE indexes are looked at otherwise, never 1_SLICE_REV1 or a 7_SLICE_NVL variant: a
    /// driver that offers those for the same slice count uses them for other work, and on a GPU
    /// without them NVML answers NOT_SUPPORTED (NVIDIA's DRA driver took the NVL one for a
    /// 7g.40gb on an A100 and failed, kubernetes-sigs/dra-driver-nvidia-gpu issue 1480). Nor is
    /// the size taken from the memory slices (a 7g GI spans 8 of them, and 8_SLICE is a
    /// profile of GPUs with 8 compute slices).
    fn full_ci_profile(
        &self,
        gi: b::nvmlGpuInstance_t,
        p: &MigProfile,
        slices: u32,
        at: &At,
    ) -> Result<b::nvmlComputeInstanceProfileInfo_v2_t> {
        const PLAIN: [u32; 7] = [
            b::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
            b::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
            b::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
            b::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
            b::NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
            b::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
            b::NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
        ];
        let mut seen = Vec::new();
        for idx in std::iter::once(p.ci_profile_index).chain(PLAIN) {
            match self.ci_profile_info(gi, idx, at) {
                Ok(info) if info.sliceCount == slices => return Ok(info),
                Ok(info) => seen.push(format!("index {idx}: {} slices", info.sliceCount)),
                Err((_, Some(e))) => return Err(e),
                Err((rc, None)) if rc == GPU_IS_LOST => {
                    return Err(nvml_err(
                        at.clone(),
                        "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
                        rc,
                    ))
                }
                Err(_) => {}
            }
        }
        Err(MigError::Other {
            at: at.clone(),
            msg: format!(
                "no compute-instance profile of this GPU instance covers its {slices} compute \
                 slices (NVML offers {}): the driver and the {} table disagree; report this",
                if seen.is_empty() {
                    "none of the plain N_SLICE profiles".to_string()
                } else {
                    seen.join(", ")
                },
                p.name
            ),
        })
    }

    /// Roll back a GI whose CI failed; returns the error to report.
    fn undo_gi(&self, gi: b::nvmlGpuInstance_t, at: &At, cause: MigError) -> MigError {
        match self.destroy_with_retry(at, "GPU instance", || raw!(self, at, "nvmlGpuInstanceDestroy", nvmlGpuInstanceDestroy, gi)) {
            Ok(_) => MigError::Other {
                at: at.clone(),
                msg: format!("compute instance creation failed, the GPU instance was destroyed again (nothing leaked): {cause}"),
            },
            Err(e2) => MigError::Other {
                at: at.clone(),
                msg: format!("compute instance creation failed ({cause}) AND destroying the GPU instance failed ({e2}): the GI LEAKED; drain the node and run `tenancyctl reconcile`"),
            },
        }
    }

    /// Roll back CIs and the GI.
    fn undo_all(&self, gi: b::nvmlGpuInstance_t, at: &At, cause: MigError) -> MigError {
        let res = self.destroy_cis(gi, at).and_then(|_| {
            self.destroy_with_retry(at, "GPU instance", || {
                raw!(
                    self,
                    at,
                    "nvmlGpuInstanceDestroy",
                    nvmlGpuInstanceDestroy,
                    gi
                )
            })
        });
        match res {
            Ok(_) => MigError::Other {
                at: at.clone(),
                msg: format!("slice setup failed, its instances were destroyed again (nothing leaked): {cause}"),
            },
            Err(e2) => MigError::Other {
                at: at.clone(),
                msg: format!("slice setup failed ({cause}) AND rollback failed ({e2}): instances LEAKED; drain the node and run `tenancyctl reconcile`"),
            },
        }
    }

    fn mig_uuid(&self, dev: b::nvmlDevice_t, gi_id: u32, ci_id: u32, at: &At) -> Result<String> {
        let mut max: u32 = 0;
        checked!(
            self,
            at,
            "nvmlDeviceGetMaxMigDeviceCount",
            nvmlDeviceGetMaxMigDeviceCount,
            dev,
            &mut max
        );
        for i in 0..max {
            let mut mig: b::nvmlDevice_t = std::ptr::null_mut();
            let rc = raw!(
                self,
                at,
                "nvmlDeviceGetMigDeviceHandleByIndex",
                nvmlDeviceGetMigDeviceHandleByIndex,
                dev,
                i,
                &mut mig
            )?;
            if rc == NOT_FOUND || rc == INVALID_ARGUMENT {
                continue;
            }
            if rc != SUCCESS {
                return Err(nvml_err(
                    at.clone(),
                    "nvmlDeviceGetMigDeviceHandleByIndex",
                    rc,
                ));
            }
            let (mut g, mut c) = (u32::MAX, u32::MAX);
            checked!(
                self,
                at,
                "nvmlDeviceGetGpuInstanceId",
                nvmlDeviceGetGpuInstanceId,
                mig,
                &mut g
            );
            checked!(
                self,
                at,
                "nvmlDeviceGetComputeInstanceId",
                nvmlDeviceGetComputeInstanceId,
                mig,
                &mut c
            );
            if g == gi_id && c == ci_id {
                let mut buf =
                    [0 as std::os::raw::c_char; b::NVML_DEVICE_UUID_V2_BUFFER_SIZE as usize];
                checked!(
                    self,
                    at,
                    "nvmlDeviceGetUUID",
                    nvmlDeviceGetUUID,
                    mig,
                    buf.as_mut_ptr(),
                    buf.len() as u32
                );
                let u = cstr(&buf);
                if !u.starts_with("MIG-") {
                    return Err(MigError::Other {
                        at: at.clone(),
                        msg: format!("MIG device UUID {u:?} does not start with MIG-"),
                    });
                }
                return Ok(u);
            }
        }
        Err(MigError::Other {
            at: at.clone(),
            msg: format!("no MIG device for GI {gi_id} CI {ci_id} among {max} MIG device slots"),
        })
    }

    /// Run a destroy call, retrying IN_USE per the policy. Ok(Destroyed/AlreadyGone, retries).
    fn destroy_with_retry<F>(&self, at: &At, what: &'static str, mut f: F) -> Result<(Outcome, u32)>
    where
        F: FnMut() -> Result<u32>,
    {
        let attempts = self.retry.attempts.max(1);
        let mut retries = 0;
        let mut waited_ms = 0u64;
        let mut wait_ms = self.retry.backoff_ms.max(1);
        let mut made = 0;
        for attempt in 1..=attempts {
            made = attempt;
            match f()? {
                SUCCESS => return Ok((Outcome::Destroyed, retries)),
                NOT_FOUND => return Ok((Outcome::AlreadyGone, retries)),
                IN_USE => {
                    let wait = wait_ms
                        .min(MAX_BACKOFF_MS)
                        .min(self.retry.budget_ms.saturating_sub(waited_ms));
                    if attempt == attempts || wait == 0 {
                        break;
                    }
                    retries += 1;
                    std::thread::sleep(Duration::from_millis(wait));
                    waited_ms += wait;
                    wait_ms = wait_ms.saturating_mul(2);
                }
                rc => {
                    return Err(nvml_err(
                        at.clone(),
                        if what == "GPU instance" {
                            "nvmlGpuInstanceDestroy"
                        } else {
                            "nvmlComputeInstanceDestroy"
                        },
                        rc,
                    ))
                }
            }
        }
        Err(MigError::InUse {
            at: at.clone(),
            what,
            attempts: made,
            waited_ms,
            gi: at.gi.unwrap_or(u32::MAX),
            ci: at.ci,
            gpu_index: at.gpu.unwrap_or(u32::MAX),
        })
    }

    /// Destroy every CI of a GI. Returns (ids destroyed, retries).
    fn destroy_cis(&self, gi: b::nvmlGpuInstance_t, at: &At) -> Result<(Vec<u32>, u32)> {
        let mut ids = Vec::new();
        let mut retries = 0;
        for (ci, id) in self.list_cis(gi, at)? {
            let at_ci = At {
                ci: Some(id),
                ..at.clone()
            };
            let (o, r) = self.destroy_with_retry(&at_ci, "compute instance", || {
                raw!(
                    self,
                    at_ci,
                    "nvmlComputeInstanceDestroy",
                    nvmlComputeInstanceDestroy,
                    ci
                )
            })?;
            retries += r;
            if o == Outcome::Destroyed {
                ids.push(id);
            }
        }
        Ok((ids, retries))
    }

    fn teardown_gi(
        &self,
        gi: b::nvmlGpuInstance_t,
        gi_id: u32,
        gpu_index: u32,
        uuid: &str,
        at: &At,
        expect_ci: Option<u32>,
    ) -> Result<Teardown> {
        let at = At {
            gi: Some(gi_id),
            ..at.clone()
        };
        let (ci_ids, r1) = self.destroy_cis(gi, &at)?;
        let (gi_out, r2) = self.destroy_with_retry(&at, "GPU instance", || {
            raw!(
                self,
                at,
                "nvmlGpuInstanceDestroy",
                nvmlGpuInstanceDestroy,
                gi
            )
        })?;
        let ci = match expect_ci {
            Some(c) if ci_ids.contains(&c) => Outcome::Destroyed,
            Some(_) => Outcome::AlreadyGone,
            None if ci_ids.is_empty() => Outcome::AlreadyGone,
            None => Outcome::Destroyed,
        };
        Ok(Teardown {
            gpu_index,
            gpu_uuid: uuid.to_string(),
            gi_id: Some(gi_id),
            ci_ids,
            ci,
            gi: gi_out,
            in_use_retries: r1 + r2,
            note: None,
        })
    }

    fn gone(gpu_index: u32, uuid: &str, gi_id: Option<u32>, note: Option<String>) -> Teardown {
        Teardown {
            gpu_index,
            gpu_uuid: uuid.to_string(),
            gi_id,
            ci_ids: Vec::new(),
            ci: Outcome::AlreadyGone,
            gi: Outcome::AlreadyGone,
            in_use_retries: 0,
            note,
        }
    }

    /// Destroy the job's CI then GI. Idempotent: what is already gone is reported, not an
    /// error. With `made` None (the prolog died between create and journaling the slice) the
    /// GI is found on the intent's GPU by profile and placement start.
    pub fn destroy(&self, intent: &MigIntent, made: Option<&MigSlice>) -> Result<Teardown> {
        self.destroy_leaving(intent, made, &[])
    }

    /// [`Self::destroy`], leaving alone the GIs in `claimed` ((GPU UUID, GI id) of slices
    /// other jobs journaled as made). Without a recorded result the slice is looked for by
    /// its intended placement and profile, and another job may have been given that
    /// placement since: a prolog killed before its GI existed frees it for the next one.
    pub fn destroy_leaving(
        &self,
        intent: &MigIntent,
        made: Option<&MigSlice>,
        claimed: &[(String, u32)],
    ) -> Result<Teardown> {
        let (dev, gpu_index, at) = self.device_by_uuid(&intent.gpu_uuid, intent.gpu_index)?;
        let at = At {
            profile: Some(intent.profile.clone()),
            placement: Some((intent.placement_start, intent.placement_size)),
            ..at
        };
        let uuid = intent.gpu_uuid.as_str();
        match made {
            Some(slice) => {
                let at = At {
                    gi: Some(slice.gi_id),
                    ..at
                };
                let mut gi: b::nvmlGpuInstance_t = std::ptr::null_mut();
                let rc = raw!(
                    self,
                    at,
                    "nvmlDeviceGetGpuInstanceById",
                    nvmlDeviceGetGpuInstanceById,
                    dev,
                    slice.gi_id,
                    &mut gi
                )?;
                if rc == NOT_FOUND || rc == INVALID_ARGUMENT {
                    return Ok(Self::gone(gpu_index, uuid, Some(slice.gi_id), None));
                }
                if rc != SUCCESS {
                    return Err(nvml_err(at, "nvmlDeviceGetGpuInstanceById", rc));
                }
                let info = self.gi_info(gi, &at)?;
                if info.placement.start != intent.placement_start
                    || info.profileId != intent.gi_profile_id
                {
                    // The id was reused by someone else's GI: ours is gone; do not touch theirs.
                    return Ok(Self::gone(
                        gpu_index,
                        uuid,
                        Some(slice.gi_id),
                        Some(format!(
                            "GI {} now is profile id {} at placement {}:{}, not this job's; left alone",
                            slice.gi_id, info.profileId, info.placement.start, info.placement.size
                        )),
                    ));
                }
                self.teardown_gi(gi, slice.gi_id, gpu_index, uuid, &at, Some(slice.ci_id))
            }
            None => {
                let model = GpuModel::from_nvml_name(
                    &self
                        .nvml
                        .device_by_index(gpu_index)
                        .and_then(|d| d.name())
                        .unwrap_or_default(),
                );
                for (gi, info) in self.gis_of(dev, model, &at)? {
                    if info.placement.start == intent.placement_start
                        && info.profileId == intent.gi_profile_id
                    {
                        if claimed.iter().any(|(u, id)| u == uuid && *id == info.id) {
                            return Ok(Self::gone(
                                gpu_index,
                                uuid,
                                Some(info.id),
                                Some(format!(
                                    "GI {} at placement {}:{} is another job's (journaled \
                                     as made); left alone",
                                    info.id, info.placement.start, info.placement.size
                                )),
                            ));
                        }
                        return self.teardown_gi(gi, info.id, gpu_index, uuid, &at, None);
                    }
                }
                Ok(Self::gone(gpu_index, uuid, None, None))
            }
        }
    }

    /// Destroy one GI (and its CIs) by id, for reconcile. Idempotent.
    pub fn destroy_gi(&self, gpu: u32, gi_id: u32) -> Result<Teardown> {
        let (dev, at) = self.device(gpu)?;
        let uuid = self
            .nvml
            .device_by_index(gpu)
            .and_then(|d| d.uuid())
            .unwrap_or_default();
        let at = At {
            uuid: Some(uuid.clone()),
            gi: Some(gi_id),
            ..at
        };
        let mut gi: b::nvmlGpuInstance_t = std::ptr::null_mut();
        let rc = raw!(
            self,
            at,
            "nvmlDeviceGetGpuInstanceById",
            nvmlDeviceGetGpuInstanceById,
            dev,
            gi_id,
            &mut gi
        )?;
        if rc == NOT_FOUND || rc == INVALID_ARGUMENT {
            return Ok(Self::gone(gpu, &uuid, Some(gi_id), None));
        }
        if rc != SUCCESS {
            return Err(nvml_err(at, "nvmlDeviceGetGpuInstanceById", rc));
        }
        self.teardown_gi(gi, gi_id, gpu, &uuid, &at, None)
    }
}
