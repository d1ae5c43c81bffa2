//! Device layer: the job may open only its own MIG slice's device nodes (plus what its tier
//! allows); every other NVIDIA device is denied. The rules live in a product-owned cgroup per
//! job (v2 BPF program on cgroup2, else v1 devices rules) that every task joins.

use crate::layer::{
    Claim, JobPlan, LayerError, LayerResult, Orphan, OrphanScope, TypedLayer, KEPT_UNREADABLE,
};
use tenancy_devices::{
    DeviceClass, DevicePolicy, DevicesRecord, DriverPaths, JobDeviceParams, SliceRef, Target,
};
use tenancy_job::contract::TaskEntry;
use tenancy_job::journal::Journal;

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

impl TypedLayer for Devices {
    type Intent = JobDeviceParams;
    type Made = DevicesRecord;

    fn survives_restart(&self) -> bool {
        false
    }

    fn name(&self) -> &'static str {
        "devices"
    }

    // The intent names the job's cgroup, which teardown finds by name; the MIG slice it lets
    // through is only known once the MIG layer has made it, so `make` reads it from the journal.
    // Both intents thus share the job's one durable journal write.
    fn intend(&mut self, plan: &JobPlan) -> LayerResult<Option<JobDeviceParams>> {
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
        Ok(Some(params))
    }

    fn make(&mut self, intent: &JobDeviceParams, journal: &Journal) -> LayerResult<DevicesRecord> {
        let mut params = intent.clone();
        // (Not in the journal: this node's folder for the slice's capability nodes.)
        params.driver.nvidia_caps = self.driver.nvidia_caps.clone();
        if let Some(m) = super::mig::Made::in_journal(journal) {
            let m = m.map_err(|e| {
                LayerError(format!(
                    "the MIG slice in the journal cannot be read: {}",
                    e.0
                ))
            })?;
            params.slices = vec![SliceRef {
                gpu_minor: m.slice.gpu_minor,
                gi_id: m.slice.gi_id,
                ci_id: m.slice.ci_id,
            }];
        }
        let programs = self
            .programs_file
            .clone()
            .and_then(|f| tenancy_devices::job::programs_for(&params.target, f));
        Ok(tenancy_devices::job::setup_sharing(
            &params,
            programs.as_ref(),
        )?)
    }

    fn undo(&mut self, intent: &JobDeviceParams, made: Option<&DevicesRecord>) -> LayerResult<()> {
        let record: DevicesRecord = match made {
            Some(m) => m.clone(),
            None => {
                // Stopped before the result was journaled: the owned cgroup is found by name,
                // and our programs on it by their tag.
                let params = intent;
                if let Target::Anchored { scope } = &params.target {
                    // Found by the id of Slurm's job folder while it exists; once Slurm
                    // removed it, the entry stays until the node program is replaced.
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
                    scope
                        .release_job_dir(params.job_id, Some(cgroup_id))
                        .map_err(|e| {
                            LayerError(format!("cannot release {}: {e}", dir.display()))
                        })?;
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

    fn resource_id(&self, intent: &JobDeviceParams, made: Option<&DevicesRecord>) -> String {
        made.map(|m| m.cgroup_dir.display().to_string())
            .unwrap_or_else(|| format!("devices job {}", intent.job_id))
    }

    /// Every task joins the job's cgroup, which the allowlist is attached to; anchored in
    /// Slurm's job folder (pure cgroup v2), it is checked to be below it instead.
    fn task_entry(&self, made: &DevicesRecord) -> TaskEntry {
        match &made.anchored {
            Some(a) => TaskEntry {
                anchor: Some(made.cgroup_dir.clone()),
                anchor_id: Some(a.cgroup_id),
                ..TaskEntry::default()
            },
            None => TaskEntry {
                join_cgroups: vec![made.cgroup_dir.clone()],
                ..TaskEntry::default()
            },
        }
    }

    /// The recorded cgroup, and the one the intent names (found by name when the result was
    /// not recorded).
    fn claims(&self, intent: &JobDeviceParams, made: Option<&DevicesRecord>) -> Vec<Claim> {
        let mut v: Vec<Claim> = made
            .map(|m| Claim::Cgroup(m.cgroup_dir.clone()))
            .into_iter()
            .collect();
        match &intent.target {
            Target::Owned { root, .. } => {
                if let Ok(d) = tenancy_devices::job::owned_dir(root, &intent.tenant, intent.job_id)
                {
                    v.push(Claim::Cgroup(d));
                }
            }
            Target::Existing { dir, .. } => v.push(Claim::Cgroup(dir.clone())),
            Target::Anchored { scope } => v.push(Claim::Cgroup(scope.job_dir(intent.job_id))),
        }
        v
    }

    /// Job cgroups under the product's folder (`tenancy/<tenant>/job_<id>`, the one the
    /// device allowlist and the firewall key on) that no journal claims.
    fn orphans(&mut self, scope: &OrphanScope) -> Vec<Orphan> {
        let layout = match tenancy_devices::CgroupLayout::detect() {
            Ok(l) => l,
            Err(e) => {
                return vec![Orphan::new(
                    "cgroup",
                    "/proc/self/mountinfo",
                    format!("cannot detect cgroups: {e}"),
                )
                .left("cgroups not checked")]
            }
        };
        let roots = [
            (layout.v2_root.clone(), tenancy_devices::Backend::V2),
            (layout.v1_devices.clone(), tenancy_devices::Backend::V1),
        ];
        let mut out = Vec::new();
        for (root, backend) in roots {
            let Some(root) = root else { continue };
            let product = root.join(tenancy_devices::job::PRODUCT_DIR);
            for (tenant, tdir) in super::subdirs(&product) {
                if !scope.wanted(&tenant) {
                    continue;
                }
                for (name, dir) in super::subdirs(&tdir) {
                    let Some(job) = super::job_id_of(&name) else {
                        continue;
                    };
                    if scope.owned.contains(&Claim::Cgroup(dir.clone())) {
                        continue;
                    }
                    if scope.unreadable.contains(&job) {
                        out.push(
                            Orphan::new(
                                "cgroup",
                                dir.display().to_string(),
                                "product cgroup of a job whose journal is unreadable",
                            )
                            .job(job)
                            .tenant(&tenant)
                            .left(KEPT_UNREADABLE),
                        );
                        continue;
                    }
                    let record = DevicesRecord {
                        job_id: job,
                        backend,
                        cgroup_dir: dir.clone(),
                        owned: true,
                        policy: DevicePolicy {
                            allow: Vec::new(),
                            deny_majors: Vec::new(),
                            deny_devices: Vec::new(),
                        },
                        v1: None,
                        v2: None,
                        anchored: None,
                    };
                    out.push(
                        Orphan::new(
                            "cgroup",
                            dir.display().to_string(),
                            "product cgroup no journal owns",
                        )
                        .job(job)
                        .tenant(&tenant)
                        .remove(move || {
                            tenancy_devices::teardown(&record)
                                .map(|_| ())
                                .map_err(|e| e.to_string())
                        }),
                    );
                }
            }
        }
        out
    }
}
