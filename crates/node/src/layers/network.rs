//! Network layer: the job's traffic is keyed by its cgroup v2 directory
//! `tenancy/<tenant>/job_<id>`; the per-tenant nftables rules are static (loaded by
//! `tenancyctl firewall apply`), so starting a job is one mkdir and never touches the ruleset.

use crate::layer::{AuditSummary, Claim, JobPlan, LayerError, LayerResult, TypedLayer};
use serde::{Deserialize, Serialize};
use tenancy_config::Config;
use tenancy_job::contract::TaskEntry;
use tenancy_job::journal::{Journal, JournalDir, StepState};
use tenancy_network::{CgroupLayout, CrossNode, FirewallSpec, JobNet, SlurmScope, TenantNet};

/// The node's firewall as the config describes it.
pub fn firewall_spec(config: &Config) -> LayerResult<FirewallSpec> {
    let mut tenants: Vec<TenantNet> = Vec::new();
    for t in config.tenants.values() {
        let id = tenant_mark(&t.name);
        if let Some(clash) = tenants.iter().find(|o| o.id == id) {
            return Err(LayerError(format!(
                "tenants '{}' and '{}' hash to the same firewall mark {id}; rename one of them",
                clash.name, t.name
            )));
        }
        tenants.push(TenantNet {
            name: t.name.clone(),
            id,
            egress: t.egress.clone(),
        });
    }
    let mut spec = FirewallSpec::detect(tenants, config.infrastructure.clone())?;
    spec.cross_node = config.node_network.map(|node_network| CrossNode {
        node_network,
        prefixes: config
            .tenants
            .values()
            .filter_map(|t| Some((t.name.clone(), t.address_prefix?)))
            .collect(),
        node: None,
    });
    Ok(spec)
}

/// A tenant's conntrack mark: derived from its name (FNV-1a), so it stays the same when other
/// tenants are added or removed and running jobs keep their marks across `firewall apply`.
fn tenant_mark(name: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % 65_535 + 1
}

pub struct Network<'c> {
    pub spec: Option<FirewallSpec>,
    pub config: &'c Config,
}

/// Everything `undo` needs, without the config.
#[derive(Serialize, Deserialize)]
pub struct Intent {
    table_name: String,
    cgroup: CgroupLayout,
    tenant: String,
    job_id: u64,
    /// Pure cgroup v2 with Slurm's cgroup/v2: the job is keyed by Slurm's job folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    slurm: Option<SlurmScope>,
}

impl Intent {
    /// The smallest spec that names this job's tenant, for teardown.
    fn spec(&self) -> FirewallSpec {
        FirewallSpec {
            table_name: self.table_name.clone(),
            cgroup: self.cgroup.clone(),
            tenants: vec![TenantNet {
                name: self.tenant.clone(),
                id: tenant_mark(&self.tenant),
                egress: Vec::new(),
            }],
            infrastructure: Vec::new(),
            slurm: self.slurm.clone(),
            cross_node: None,
        }
    }
}

impl Network<'_> {
    fn spec(&mut self) -> LayerResult<&FirewallSpec> {
        if self.spec.is_none() {
            self.spec = Some(firewall_spec(self.config)?);
        }
        Ok(self.spec.as_ref().expect("just built"))
    }
}

impl TypedLayer for Network<'_> {
    type Intent = Intent;
    type Made = JobNet;

    fn survives_restart(&self) -> bool {
        false
    }

    fn name(&self) -> &'static str {
        "network"
    }

    fn intend(&mut self, plan: &JobPlan) -> LayerResult<Option<Intent>> {
        let spec = self.spec()?;
        Ok(Some(Intent {
            table_name: spec.table_name.clone(),
            cgroup: spec.cgroup.clone(),
            tenant: plan.tenant.clone(),
            job_id: plan.job_id,
            slurm: spec.slurm.clone(),
        }))
    }

    fn make(&mut self, intent: &Intent, _: &Journal) -> LayerResult<JobNet> {
        Ok(tenancy_network::add_job(
            self.spec()?,
            &intent.tenant,
            intent.job_id,
        )?)
    }

    fn undo(&mut self, intent: &Intent, made: Option<&JobNet>) -> LayerResult<()> {
        if let Some(scope) = &intent.slurm {
            let id = made.and_then(|j| j.cgroup_id);
            tenancy_network::remove_anchored_job(&intent.spec(), scope, intent.job_id, id)?;
            return Ok(());
        }
        tenancy_network::remove_job(&intent.spec(), &intent.tenant, intent.job_id)?;
        Ok(())
    }

    fn resource_id(&self, i: &Intent, _: Option<&JobNet>) -> String {
        match &i.slurm {
            Some(scope) => scope.job_dir(i.job_id).display().to_string(),
            None => i.cgroup.job_dir(&i.tenant, i.job_id).display().to_string(),
        }
    }

    /// The firewall keys on the job's cgroup: every task joins it, or, anchored in Slurm's job
    /// folder (pure cgroup v2), is checked to be below it.
    fn task_entry(&self, made: &JobNet) -> TaskEntry {
        match made.cgroup_id {
            Some(id) => TaskEntry {
                anchor: Some(made.cgroup_path.clone()),
                anchor_id: Some(id),
                ..TaskEntry::default()
            },
            None => TaskEntry {
                join_cgroups: vec![made.cgroup_path.clone()],
                ..TaskEntry::default()
            },
        }
    }

    /// The table whose drop counters the job's end record reports.
    fn audit_summary(&self, intent: &Intent, _: Option<&JobNet>) -> AuditSummary {
        AuditSummary {
            firewall_table: Some(intent.table_name.clone()),
            ..AuditSummary::default()
        }
    }

    fn claims(&self, _: &Intent, made: Option<&JobNet>) -> Vec<Claim> {
        made.map(|m| Claim::Cgroup(m.cgroup_path.clone()))
            .into_iter()
            .collect()
    }
}

/// `tenancyctl firewall apply`: replaces the node's table, keeping the jobs maps' elements of
/// every job its journal says is anchored in Slurm's job folder (pure cgroup v2), in the same
/// transaction. Runs under the node lock, which every prolog and epilog holds while it adds or
/// deletes elements. A journal that cannot be read is an error there: its job's elements
/// would be lost. Returns the jobs kept.
pub fn apply_keeping_jobs(
    spec: &FirewallSpec,
    state_dir: &std::path::Path,
) -> LayerResult<Vec<u64>> {
    if tenancy_network::anchored_level(spec).is_none() || !state_dir.is_dir() {
        return Ok(tenancy_network::apply_keeping(spec, &[])?);
    }
    let journals = JournalDir::at(state_dir);
    let _lock = journals.lock_node().map_err(|e| {
        LayerError(format!(
            "cannot take the node lock in {}: {e}",
            state_dir.display()
        ))
    })?;
    let mut jobs = Vec::new();
    for id in journals.job_ids().map_err(|e| {
        LayerError(format!(
            "cannot list the journals in {}: {e}",
            state_dir.display()
        ))
    })? {
        let journal = journals.load(id).map_err(|e| {
            LayerError(format!(
                "job {id}: its journal cannot be read ({e}), so its firewall elements cannot be \
                 kept; fix it or run `tenancyctl reconcile`, then apply again"
            ))
        })?;
        let Some(journal) = journal else { continue };
        let made = journal
            .steps
            .iter()
            .filter(|s| s.layer == "network" && s.state == StepState::Made)
            .filter_map(|s| s.made.as_ref())
            .filter_map(|m| serde_json::from_value::<JobNet>(m.clone()).ok());
        jobs.extend(made.filter_map(|m| tenancy_network::AnchoredJob::of(&m)));
    }
    Ok(tenancy_network::apply_keeping(spec, &jobs)?)
}

/// Drops of `tenant` since the last job end on this node reported them: the tenant's nft
/// counter minus what earlier `job_end` records already carried (kept in
/// `state_dir/firewall-drops.json`, under the node lock). Summed over the audit log this is
/// the counter's total, without double counting jobs that ran side by side.
pub fn drops_since_last_report(journals: &JournalDir, table: &str, tenant: &str) -> Option<u64> {
    let now = tenancy_network::tenant_drops(table, tenant).ok()??;
    let _lock = journals.lock_node().ok()?;
    let path = journals.path().join("firewall-drops.json");
    let mut seen: std::collections::BTreeMap<String, u64> = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let last = seen.insert(tenant.to_string(), now).unwrap_or(0);
    // Most jobs end with no new drop: then there is nothing to write.
    if now != last {
        journals
            .replace_file(
                "firewall-drops.json",
                &serde_json::to_vec(&seen).ok()?,
                false,
            )
            .ok()?;
    }
    // A smaller value means the table was reloaded and counts from zero again.
    Some(if now >= last { now - last } else { now })
}

#[cfg(test)]
mod tests {
    #[test]
    fn tenant_marks_are_stable_and_in_range() {
        assert_eq!(super::tenant_mark("acme"), super::tenant_mark("acme"));
        assert_ne!(super::tenant_mark("acme"), super::tenant_mark("globex"));
        for n in ["a", "acme", "globex", &"z".repeat(32)] {
            assert!((1..=65_535).contains(&super::tenant_mark(n)));
        }
    }
}
