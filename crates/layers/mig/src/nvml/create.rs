//! Making a job's slice: its GPU instance at the intent's placement, then the full-size
//! compute instance, each rolled back when the next step fails.

use super::{cstr, nvml_err, Mig, GPU_IS_LOST, INVALID_ARGUMENT, NOT_FOUND, SUCCESS};
use crate::error::{At, MigError, Result};
use crate::profiles::{GpuModel, MigProfile};
use crate::{MigIntent, MigSlice};
use nvml_wrapper_sys::bindings as b;

impl Mig {
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
        let (name, minor) = self.sliceable(intent, gpu_index, &at)?;
        let p = self.profile_for(intent, &name, &at)?;
        let (gi, slices) = self.create_gi(dev, intent, p, &at)?;
        let gi_info = match self.gi_info(gi, &at) {
            Ok(i) => i,
            Err(e) => return Err(self.undo_gi(gi, &at, e)),
        };
        let at = At {
            gi: Some(gi_info.id),
            ..at
        };
        let ci_id = self.create_full_ci(gi, p, slices, &at)?;
        let at = At {
            ci: Some(ci_id),
            ..at
        };
        let mig_uuid = match self.mig_uuid(dev, gi_info.id, ci_id, &at) {
            Ok(u) => u,
            Err(e) => return Err(self.undo_all(gi, &at, e)),
        };
        Ok(MigSlice {
            gpu_index,
            gpu_minor: minor,
            gpu_uuid: intent.gpu_uuid.clone(),
            gi_id: gi_info.id,
            ci_id,
            mig_uuid,
        })
    }

    /// Whether a slice may be made on the intent's GPU now: MIG mode on with no change
    /// pending, not in confidential-computing mode. Returns the GPU's name and minor number.
    fn sliceable(&self, intent: &MigIntent, gpu_index: u32, at: &At) -> Result<(String, u32)> {
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
                    at: at.clone(),
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
        Ok((name, minor))
    }

    /// The GPU instance of profile `p` at the intent's placement. Returns it with the GI
    /// profile's compute slice count.
    fn create_gi(
        &self,
        dev: b::nvmlDevice_t,
        intent: &MigIntent,
        p: &MigProfile,
        at: &At,
    ) -> Result<(b::nvmlGpuInstance_t, u32)> {
        let pinfo = self.gi_profile_info(dev, p.gi_profile_index, at)?;
        if pinfo.id != p.gi_profile_id {
            return Err(MigError::Other {
                at: at.clone(),
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
        Ok((gi, pinfo.sliceCount))
    }

    /// The compute instance that covers the whole of GI `gi`; its id. When it cannot be made
    /// or read, the GI (and a CI made) is destroyed before the error returns.
    fn create_full_ci(
        &self,
        gi: b::nvmlGpuInstance_t,
        p: &MigProfile,
        slices: u32,
        at: &At,
    ) -> Result<u32> {
        let ci_pinfo = match self.full_ci_profile(gi, p, slices, at) {
            Ok(i) => i,
            Err(e) => return Err(self.undo_gi(gi, at, e)),
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
            Err(e) => return Err(self.undo_gi(gi, at, e)),
        };
        if rc != SUCCESS {
            return Err(self.undo_gi(
                gi,
                at,
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
            Err(e) => return Err(self.undo_all(gi, at, e)),
        };
        if rc != SUCCESS {
            return Err(self.undo_all(
                gi,
                at,
                nvml_err(at.clone(), "nvmlComputeInstanceGetInfo_v2", rc),
            ));
        }
        Ok(ci_info.id)
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
}
