//! Tearing slices down, idempotently, retrying NVML_ERROR_IN_USE within the policy.

use super::{nvml_err, Mig, INVALID_ARGUMENT, IN_USE, MAX_BACKOFF_MS, NOT_FOUND, SUCCESS};
use crate::error::{At, MigError, Result};
use crate::profiles::GpuModel;
use crate::{MigIntent, MigSlice, Outcome, Teardown};
use nvml_wrapper_sys::bindings as b;
use std::time::Duration;

impl Mig {
    /// Run a destroy call, retrying IN_USE per the policy. Ok(Destroyed/AlreadyGone, retries).
    pub(super) fn destroy_with_retry<F>(
        &self,
        at: &At,
        what: &'static str,
        mut f: F,
    ) -> Result<(Outcome, u32)>
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
    pub(super) fn destroy_cis(&self, gi: b::nvmlGpuInstance_t, at: &At) -> Result<(Vec<u32>, u32)> {
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
        match made {
            Some(slice) => self.destroy_recorded(dev, gpu_index, at, intent, slice),
            None => self.destroy_unrecorded(dev, gpu_index, &at, intent, claimed),
        }
    }

    /// The slice the journal recorded as made, by its GI id, unless that id now names
    /// another GI.
    fn destroy_recorded(
        &self,
        dev: b::nvmlDevice_t,
        gpu_index: u32,
        at: At,
        intent: &MigIntent,
        slice: &MigSlice,
    ) -> Result<Teardown> {
        let uuid = intent.gpu_uuid.as_str();
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
        if info.placement.start != intent.placement_start || info.profileId != intent.gi_profile_id
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

    /// A slice with no recorded result: the GI at the intent's placement and profile, unless
    /// another job journaled it as made.
    fn destroy_unrecorded(
        &self,
        dev: b::nvmlDevice_t,
        gpu_index: u32,
        at: &At,
        intent: &MigIntent,
        claimed: &[(String, u32)],
    ) -> Result<Teardown> {
        let uuid = intent.gpu_uuid.as_str();
        let model = GpuModel::from_nvml_name(
            &self
                .nvml
                .device_by_index(gpu_index)
                .and_then(|d| d.name())
                .unwrap_or_default(),
        );
        for (gi, info) in self.gis_of(dev, model, at)? {
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
                return self.teardown_gi(gi, info.id, gpu_index, uuid, at, None);
            }
        }
        Ok(Self::gone(gpu_index, uuid, None, None))
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
