//! Scratch layer: `<scratch_root>/<tenant>/job_<id>` owned by the job's user; wiped or retained
//! at job end as the tier says.

use crate::contract::TaskEntry;
use crate::journal::Journal;
use crate::layer::{JobPlan, LayerResult, TypedLayer};
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
        }
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
        let text = "[cluster]\nname = \"t\"\nstate_dir = \"/s\"\naudit_log = \"/a.jsonl\"\n\
                    scratch_root = \"/scratch\"\n[tiers.internal]\n[tenants.acme]\n\
                    tier = \"internal\"\ngroups = [\"root\", \"daemon\"]\n[tenants.solo]\n\
                    tier = \"internal\"\ngroups = [\"bin\"]\n";
        let config = tenancy_config::Config::parse(text, std::path::Path::new("/t.toml")).unwrap();
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
