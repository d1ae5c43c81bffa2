//! The node's GPUs as NVML shows them: MIG mode, confidential computing, a GPU lost.

use super::{code_name, cstr, lost_reason, GpuInfo, Mig, NOT_SUPPORTED, SUCCESS};
use crate::error::{At, MigError, Result};
use crate::plan::PlanGpu;
use crate::profiles::GpuModel;
use nvml_wrapper::error::nvml_sym;
use nvml_wrapper_sys::bindings as b;

/// What NVML says of confidential computing on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CcState {
    /// Off, or a driver without the API (no CC-capable GPU).
    Off,
    On,
    /// The query failed: every GPU is treated as in CC mode (fail closed).
    Unknown(String),
}

impl Mig {
    /// Confidential computing on this node (nvmlSystemGetConfComputeState).
    pub(super) fn cc_state(&self) -> CcState {
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
    pub(super) fn cc_reason(&self, cc: &CcState, dev: b::nvmlDevice_t) -> Option<String> {
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
        for i in 0..n {
            let at = At {
                gpu: Some(i),
                ..Default::default()
            };
            let d = match self.nvml.device_by_index(i) {
                Ok(d) => d,
                Err(nvml_wrapper::error::NvmlError::GpuLost) => {
                    out.push(GpuInfo::lost(i));
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
                            out.push(GpuInfo::lost(i));
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
            let unusable = unusable_reason(i, &uuid, cc_why, current, pending);
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
}

impl GpuInfo {
    /// A GPU that fell off the bus: only its index is known.
    fn lost(i: u32) -> GpuInfo {
        GpuInfo {
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
        }
    }
}

/// Why no slice may be made on GPU `i` now, from its CC mode (`cc_why`) and MIG mode.
fn unusable_reason(
    i: u32,
    uuid: &str,
    cc_why: Option<String>,
    current: bool,
    pending: bool,
) -> Option<String> {
    if let Some(why) = cc_why {
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
    }
}
