//! Device layer: the job may open only its own MIG slice's device nodes (plus what its tier
//! allows); every other NVIDIA device is denied. The rules live in a product-owned cgroup per
//! job (v2 BPF program on cgroup2, else v1 devices rules) that every task joins.

use crate::journal::Journal;
use crate::layer::{JobPlan, Layer, LayerError, LayerResult};
use serde_json::Value;
use tenancy_devices::{
    DeviceClass, DevicePolicy, DevicesRecord, DriverPaths, JobDeviceParams, SliceRef, Target,
};

pub struct Devices {
    pub driver: DriverPaths,
    /// Detected once per process, on first use.
    pub target: Option<Target>,
    /// Where the device programs jobs on this node share are remembered (cgroup v2).
    pub programs_file: Option<std::path::PathBuf>,
}

impl Devices {
    fn target(&mut self) -> LayerResult<Target> {
        if self.target.is_none() {
            self.target = Some(Target::detect()?);
        }
        Ok(self.target.clone().expect("just set"))
    }
}

impl Layer for Devices {
    fn survives_restart(&self) -> bool {
        false
    }

    fn name(&self) -> &'static str {
        "devices"
    }

    // The intent names the job's cgroup, which teardown finds by name; the MIG slice it lets
    // through is only known once the MIG layer has made it, so `make` reads it from the journal.
    // Both intents thus share the job's one durable journal write.
    fn intend(&mut self, plan: &JobPlan) -> LayerResult<Option<Value>> {
        let extra = plan
            .tier
            .device_classes
            .iter()
            .map(|c| {
                c.parse::<DeviceClass>().map_err(|e| {
                    LayerError(format!("tier {} device class '{c}': {e}", plan.tier.name))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let params = JobDeviceParams {
            job_id: plan.job_id,
            tenant: plan.tenant.clone(),
            slices: Vec::new(),
            extra,
            driver: self.driver.clone(),
            target: self.target()?,
        };
        Ok(Some(serde_json::to_value(params)?))
    }

    fn make(&mut self, intent: &Value, journal: &Journal) -> LayerResult<Value> {
        let mut params: JobDeviceParams = serde_json::from_value(intent.clone())?;
        if let Some(m) = journal.made_by("mig") {
            params.slices = vec![SliceRef {
                gpu_minor: field(m, "gpu_minor")?,
                gi_id: field(m, "gi_id")?,
                ci_id: field(m, "ci_id")?,
            }];
        }
        let programs = self
            .programs_file
            .clone()
            .and_then(|f| tenancy_devices::job::programs_for(&params.target, f));
        let record = tenancy_devices::job::setup_sharing(&params, programs.as_ref())?;
        let mut made = serde_json::to_value(&record)?;
        if record.anchored.is_some() {
            // Anchored in Slurm's job folder: its processes stay where Slurm put them.
            made["join_cgroups"] = serde_json::json!([]);
            made["anchor"] = serde_json::json!(record.cgroup_dir);
        } else {
            made["join_cgroups"] = serde_json::json!([record.cgroup_dir]);
        }
        Ok(made)
    }

    fn undo(&mut self, intent: &Value, made: Option<&Value>) -> LayerResult<()> {
        let record: DevicesRecord = match made {
            Some(m) => serde_json::from_value(m.clone())?,
            None => {
                // Stopped before the result was journaled: the owned cgroup is found by name,
                // and our programs on it by their tag.
                let params: JobDeviceParams = serde_json::from_value(intent.clone())?;
                if let Target::Anchored { scope } = &params.target {
                    // Found by the id of Slurm's job folder while it exists; once Slurm
                    // removed it, `tenancyctl reconcile` finds the entry of no folder.
                    let dir = scope.job_dir(params.job_id);
                    let Ok(cgroup_id) = tenancy_cgroup::slurm::cgroup_id(&dir) else {
                        return Ok(());
                    };
                    tenancy_devices::anchored::remove_job(
                        &tenancy_devices::anchored::AnchoredAttached {
                            scope_dir: scope.dir(),
                            cgroup_id,
                            slot: None,
                            prog_id: None,
                        },
                    )?;
                    return Ok(());
                }
                let (cgroup_dir, backend, owned) = match &params.target {
                    Target::Owned { root, backend } => (
                        tenancy_devices::job::owned_dir(root, &params.tenant, params.job_id)?,
                        *backend,
                        true,
                    ),
                    Target::Existing { dir, backend } => (dir.clone(), *backend, false),
                    Target::Anchored { .. } => unreachable!("handled above"),
                };
                DevicesRecord {
                    job_id: params.job_id,
                    backend,
                    cgroup_dir,
                    owned,
                    policy: DevicePolicy {
                        allow: Vec::new(),
                        deny_majors: Vec::new(),
                        deny_devices: Vec::new(),
                    },
                    v1: None,
                    v2: None,
                    anchored: None,
                }
            }
        };
        tenancy_devices::teardown(&record)?;
        Ok(())
    }

    fn resource_id(&self, intent: &Value, made: Option<&Value>) -> String {
        made.and_then(|m| m.get("cgroup_dir"))
            .and_then(Value::as_str)
            .map(String::from)
            .unwrap_or_else(|| format!("devices job {}", intent["job_id"]))
    }
}

fn field(v: &Value, name: &str) -> LayerResult<u32> {
    v.get(name)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| LayerError(format!("the MIG slice in the journal has no valid {name}")))
}
