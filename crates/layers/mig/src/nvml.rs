//! The NVML side: raw GI/CI calls through nvml-wrapper's symbol table. This module opens the
//! session and holds the calls' error handling; `gpus` reads the GPUs' state, `instances` lists
//! GPU and compute instances, `create` makes a job's slice and `destroy` tears slices down.

use crate::choose::choose_in;
use crate::error::{At, MigError, Result};
use crate::plan::Slot;
use crate::profiles::GpuModel;
use crate::{MigIntent, Occupant, Request};
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings as b;
use serde::{Deserialize, Serialize};
use std::path::Path;

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
        match nvml_wrapper::error::nvml_sym($self.nvml.lib().$f.as_ref()) {
            Ok(f) => Ok(unsafe { f($($arg),*) }),
            Err(e) => Err($crate::nvml::sym_err($at.clone(), $op, e)),
        }
    }};
}

/// `raw!` for calls where any return code but SUCCESS is an error naming the call.
macro_rules! checked {
    ($self:ident, $at:expr, $op:literal, $f:ident $(, $arg:expr)* ) => {{
        let rc = raw!($self, $at, $op, $f $(, $arg)*)?;
        if rc != $crate::nvml::SUCCESS {
            return Err($crate::nvml::nvml_err($at.clone(), $op, rc));
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

// After the macros: they use them.
mod create;
mod destroy;
mod gpus;
mod instances;

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

    /// Pick GPU and placement for a request (see [`choose_in`]). Occupancy comes from NVML;
    /// `occupants` (other live jobs' journals, read under the node lock) gives tenants.
    pub fn choose(&self, req: &Request, occupants: &[Occupant]) -> Result<MigIntent> {
        let views = self.instances()?;
        choose_in(&views, self.plan.as_deref(), req, occupants)
    }
}
