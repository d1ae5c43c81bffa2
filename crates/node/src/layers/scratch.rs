//! Scratch layer: `<scratch_root>/<tenant>/job_<id>` owned by the job's user; wiped or retained
//! at job end as the tier says.

use crate::contract::TaskEntry;
use crate::journal::Journal;
use crate::layer::{
    Claim, JobPlan, LayerResult, Orphan, OrphanAction, OrphanScope, TypedLayer, KEPT_UNREADABLE,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;
use std::time::SystemTime;
use tenancy_config::ScratchOnExit;
use tenancy_scratch::{Created, Retained, ScratchSpec, Wiped};

pub struct Scratch<'a> {
    pub root: PathBuf,
    pub config: &'a tenancy_config::Config,
    /// Mounts the last undo detached under the job folder, for the job's record.
    pub detached: Vec<PathBuf>,
}

impl Scratch<'_> {
    /// The gids of the tenant's groups when it has more than one (members through any of them
    /// reach the tenant folder through its ACL); none for a tenant of one group, the usual
    /// case, which costs no lookup.
    fn tenant_groups(&self, tenant: &str) -> Vec<u32> {
        match self.config.tenants.get(tenant) {
            Some(t) if t.groups.len() > 1 => t
                .groups
                .iter()
                .filter_map(|g| tenancy_config::group_gid(g))
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Everything teardown needs, including the tier's policy at job start.
#[derive(Serialize, Deserialize)]
pub struct Intent {
    spec: ScratchSpec,
    on_exit: ScratchOnExit,
}

impl TypedLayer for Scratch<'_> {
    type Intent = Intent;
    type Made = Created;

    fn name(&self) -> &'static str {
        "scratch"
    }

    fn intend(&mut self, plan: &JobPlan) -> LayerResult<Option<Intent>> {
        let spec = ScratchSpec {
            root: self.root.clone(),
            tenant: plan.tenant.clone(),
            tenant_gid: plan.tenant_gid,
            job_id: plan.job_id,
            uid: plan.uid,
            gid: plan.gid,
            mode: plan.tier.scratch_mode,
            quota: None,
            tenant_groups: self.tenant_groups(&plan.tenant),
        };
        spec.validate()?;
        Ok(Some(Intent {
            spec,
            on_exit: plan.tier.scratch_on_exit,
        }))
    }

    fn make(&mut self, intent: &Intent, _: &Journal) -> LayerResult<Created> {
        Ok(tenancy_scratch::create(&intent.spec)?)
    }

    fn undo(&mut self, intent: &Intent, _made: Option<&Created>) -> LayerResult<()> {
        self.detached = match intent.on_exit {
            ScratchOnExit::Wipe => match tenancy_scratch::wipe(&intent.spec)? {
                Wiped::Removed { detached, .. } => detached,
                Wiped::AlreadyGone { .. } => Vec::new(),
            },
            ScratchOnExit::Retain => {
                match tenancy_scratch::retain(&intent.spec, SystemTime::now())? {
                    Retained::Moved { detached, .. } => detached,
                    Retained::AlreadyGone { .. } => Vec::new(),
                }
            }
        };
        Ok(())
    }

    fn undo_notes(&mut self) -> serde_json::Map<String, Value> {
        let mut notes = serde_json::Map::new();
        let detached = std::mem::take(&mut self.detached);
        if !detached.is_empty() {
            notes.insert(
                "detached_mounts".into(),
                detached.iter().map(|p| p.display().to_string()).collect(),
            );
        }
        notes
    }

    fn resource_id(&self, intent: &Intent, _: Option<&Created>) -> String {
        intent.spec.job_dir().display().to_string()
    }

    /// The job's folder is its tasks' temporary folder.
    fn task_entry(&self, made: &Created) -> TaskEntry {
        let path = made.path.display().to_string();
        TaskEntry {
            join_cgroups: Vec::new(),
            env: vec![
                ("TMPDIR".into(), path.clone()),
                ("TENANCY_SCRATCH".into(), path),
            ],
            anchor: None,
        }
    }

    /// Scratch folders are named by tenant and job.
    fn claims(&self, intent: &Intent, _: Option<&Created>) -> Vec<Claim> {
        vec![Claim::JobFolder {
            tenant: intent.spec.tenant.clone(),
            job_id: intent.spec.job_id,
        }]
    }

    /// Job folders no journal claims and Slurm no longer has (on a scratch_root the nodes
    /// share, a job of another node has its folder here), then retained folders past the
    /// longest retention of any tier.
    fn orphans(&mut self, scope: &OrphanScope) -> Vec<Orphan> {
        let root = self.root.clone();
        if !root.is_dir() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let known = match scope.known {
            Ok(k) => Some(k),
            Err(why) => {
                out.push(
                    Orphan::new(
                        "scratch",
                        root.display().to_string(),
                        format!("Slurm cannot be asked which jobs it still has: {why}"),
                    )
                    .left(
                        "job folders not checked (on a scratch_root the nodes share, they may \
                         be jobs running on other nodes)",
                    ),
                );
                None
            }
        };
        for (tenant, tdir) in super::subdirs(&root)
            .into_iter()
            .filter(|_| known.is_some())
        {
            if !scope.wanted(&tenant) || tenancy_scratch::validate_tenant_name(&tenant).is_err() {
                continue;
            }
            let gid = match std::fs::symlink_metadata(&tdir) {
                Ok(m) => std::os::unix::fs::MetadataExt::gid(&m),
                Err(_) => continue,
            };
            for (name, dir) in super::subdirs(&tdir) {
                let Some(job) = super::job_id_of(&name) else {
                    continue;
                };
                // Owned here, or a job Slurm still has, here or on another node sharing the
                // scratch_root.
                let claim = Claim::JobFolder {
                    tenant: tenant.clone(),
                    job_id: job,
                };
                if scope.owned.contains(&claim) || known.is_some_and(|k| k.contains(&job)) {
                    continue;
                }
                if scope.unreadable.contains(&job) {
                    out.push(
                        Orphan::new(
                            "scratch",
                            dir.display().to_string(),
                            "job folder of a job whose journal is unreadable",
                        )
                        .job(job)
                        .tenant(&tenant)
                        .left(KEPT_UNREADABLE),
                    );
                    continue;
                }
                let spec = ScratchSpec {
                    root: root.clone(),
                    tenant: tenant.clone(),
                    tenant_gid: gid,
                    job_id: job,
                    uid: 65534,
                    gid: 65534,
                    mode: tenancy_scratch::DEFAULT_JOB_MODE,
                    quota: None,
                    tenant_groups: Vec::new(),
                };
                out.push(
                    Orphan::new(
                        "scratch",
                        dir.display().to_string(),
                        "job folder no journal owns",
                    )
                    .job(job)
                    .tenant(&tenant)
                    .remove(move || {
                        tenancy_scratch::wipe(&spec)
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    }),
                );
            }
        }
        out.extend(self.retained_orphans(&root, scope.apply));
        out
    }
}

impl Scratch<'_> {
    /// Retained folders past the longest retention of any tier (so no tenant loses data
    /// early), removed by the search itself with `--apply`.
    fn retained_orphans(&self, root: &std::path::Path, apply: bool) -> Vec<Orphan> {
        let days = self
            .config
            .tiers
            .values()
            .map(|t| u64::from(t.retain_days))
            .max()
            .unwrap_or(0);
        let actions = match tenancy_scratch::purge_retained(root, days, SystemTime::now(), !apply) {
            Err(e) => {
                return vec![Orphan::new(
                    "retained",
                    root.display().to_string(),
                    format!("cannot purge: {e}"),
                )
                .left("retained folders not checked")]
            }
            Ok(actions) => actions,
        };
        let past = |path: &std::path::Path, tenant: &str, job_id: u64, age_days: u64| {
            Orphan::new(
                "retained",
                path.display().to_string(),
                format!("retained {age_days} day(s), past {days}"),
            )
            .job(job_id)
            .tenant(tenant)
        };
        let mut out = Vec::new();
        for a in actions {
            out.push(match a {
                tenancy_scratch::Action::Remove {
                    path,
                    tenant,
                    job_id,
                    age_days,
                    dry_run,
                    ..
                } => {
                    let mut o = past(&path, &tenant, job_id, age_days);
                    o.what = if dry_run {
                        OrphanAction::Done {
                            action: "would remove".into(),
                            ok: true,
                            left: true,
                            audit: false,
                        }
                    } else {
                        OrphanAction::Done {
                            action: "removed".into(),
                            ok: true,
                            left: false,
                            audit: true,
                        }
                    };
                    o
                }
                tenancy_scratch::Action::Skip { path, reason } => {
                    Orphan::new("retained", path.display().to_string(), reason)
                        .left("not ours or unsafe")
                }
                tenancy_scratch::Action::Failed {
                    path,
                    tenant,
                    job_id,
                    age_days,
                    error,
                    ..
                } => {
                    let mut o = past(&path, &tenant, job_id, age_days);
                    o.what = OrphanAction::Done {
                        action: format!("failed: {error}"),
                        ok: false,
                        left: true,
                        audit: true,
                    };
                    o
                }
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::Layer;

    /// A tenant of several groups gets them all in its scratch intent (the tenant folder's
    /// ACL lets members through any of them in); a tenant of one group needs none.
    #[test]
    fn the_intent_names_every_group_of_a_tenant_of_several() {
        let mut text = tenancy_test_support::TenancyToml::under("t", std::path::Path::new("/"));
        text.tier("internal");
        text.tenant("acme")
            .tier("internal")
            .groups(["root", "daemon"]);
        text.tenant("solo").tier("internal").groups(["bin"]);
        let config =
            tenancy_config::Config::parse(&text.to_string(), std::path::Path::new("/t.toml"))
                .unwrap();
        let mut layer = Scratch {
            root: "/scratch".into(),
            config: &config,
            detached: Vec::new(),
        };
        let plan = |tenant: &str| JobPlan {
            job_id: 7,
            uid: 1000,
            gid: 1000,
            user: "u1000".into(),
            node: "n".into(),
            tenant: tenant.into(),
            tenant_gid: 0,
            tier: config.tiers["internal"].clone(),
            profile: None,
            gres_gpus: None,
            others: Vec::new(),
        };
        let mut groups = |tenant: &str| -> Vec<u32> {
            let intent: Intent =
                serde_json::from_value(Layer::intend(&mut layer, &plan(tenant)).unwrap().unwrap())
                    .unwrap();
            intent.spec.tenant_groups
        };
        let daemon = tenancy_config::group_gid("daemon").unwrap();
        assert_eq!(groups("acme"), vec![0, daemon]);
        assert_eq!(groups("solo"), Vec::<u32>::new());
    }
}
