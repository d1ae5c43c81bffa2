//! The scheduler layer's part of the config: each tenant's quota (`limits`, which
//! `tenancyctl slurm sync` makes into slurmdbd associations that slurmctld enforces) and node
//! pools (`nodes`, which job_submit/tenancy keeps each job inside or out of, and the prolog
//! checks as a last line).

use crate::hostlist::Hostlist;
use crate::{Config, RawTenant, Tenant, Validator};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use toml::Spanned;

/// A tenant's quota. Every field is a ceiling on what the tenant's jobs hold at once, over all
/// its accounts (Slurm's `GrpTRES` and `GrpJobs` of the tenant's account, which its other
/// accounts sit under); a job that would go over it waits in the queue with Slurm's reason
/// (`AssocGrpGRES`, `AssocGrpNodeLimit`, `AssocGrpJobsLimit`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// GPUs of any kind, whole GPUs and MIG slices alike (`GrpTRES=gres/gpu=N`).
    #[serde(default)]
    pub gpus: Option<u32>,
    /// MIG slices per profile (`GrpTRES=gres/gpu:<profile>=N`, the typed GPU GRES).
    #[serde(default)]
    pub mig_slices: BTreeMap<String, u32>,
    /// Nodes (`GrpTRES=node=N`).
    #[serde(default)]
    pub nodes: Option<u32>,
    /// Jobs running at once (`GrpJobs=N`).
    #[serde(default)]
    pub running_jobs: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    gpus: Option<u32>,
    #[serde(default)]
    mig_slices: BTreeMap<Spanned<String>, u32>,
    nodes: Option<u32>,
    running_jobs: Option<u32>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.gpus.is_none()
            && self.mig_slices.is_empty()
            && self.nodes.is_none()
            && self.running_jobs.is_none()
    }

    /// These limits with `own`'s keys in place of theirs.
    pub fn overridden_by(mut self, own: Option<&Limits>) -> Limits {
        let Some(own) = own else { return self };
        self.gpus = own.gpus.or(self.gpus);
        self.nodes = own.nodes.or(self.nodes);
        self.running_jobs = own.running_jobs.or(self.running_jobs);
        for (p, n) in &own.mig_slices {
            self.mig_slices.insert(p.clone(), *n);
        }
        self
    }

    /// The `GrpTRES` items these limits set, as sacctmgr names the TRES.
    pub fn grp_tres(&self) -> BTreeMap<String, u32> {
        let mut out = BTreeMap::new();
        if let Some(n) = self.gpus {
            out.insert("gres/gpu".to_string(), n);
        }
        for (p, n) in &self.mig_slices {
            out.insert(format!("gres/gpu:{p}"), *n);
        }
        if let Some(n) = self.nodes {
            out.insert("node".to_string(), n);
        }
        out
    }
}

/// Whose node pool it is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum PoolOwner {
    Tier(String),
    Tenant(String),
}

impl std::fmt::Display for PoolOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolOwner::Tier(t) => write!(f, "tier '{t}'"),
            PoolOwner::Tenant(t) => write!(f, "tenant '{t}'"),
        }
    }
}

/// A node pool: the nodes a tier's or tenant's jobs run on, and no one else's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool<'a> {
    pub owner: PoolOwner,
    pub nodes: &'a Hostlist,
}

impl Tenant {
    /// The Slurm account that carries the tenant's limits: one named after the tenant, which
    /// its other accounts sit under in slurmdbd's tree (`tenancyctl slurm sync` makes them so).
    pub fn limit_account(&self) -> &str {
        &self.name
    }

    /// The accounts the tenant's jobs run under: its `accounts`, or its limit account alone.
    pub fn job_accounts(&self) -> Vec<String> {
        if self.accounts.is_empty() {
            vec![self.name.clone()]
        } else {
            self.accounts.clone()
        }
    }
}

impl Config {
    /// Every node pool: the tiers', then the tenants'.
    pub fn pools(&self) -> Vec<Pool<'_>> {
        let tiers = self.tiers.values().filter_map(|t| {
            Some(Pool {
                owner: PoolOwner::Tier(t.name.clone()),
                nodes: t.nodes.as_ref()?,
            })
        });
        let tenants = self.tenants.values().filter_map(|t| {
            Some(Pool {
                owner: PoolOwner::Tenant(t.name.clone()),
                nodes: t.nodes.as_ref()?,
            })
        });
        tiers.chain(tenants).collect()
    }

    /// The pool a tenant's jobs are kept in: its own, else its tier's; none: any node that is
    /// in no other pool.
    pub fn pool_of<'a>(&'a self, tenant: &'a Tenant) -> Option<Pool<'a>> {
        if let Some(nodes) = &tenant.nodes {
            return Some(Pool {
                owner: PoolOwner::Tenant(tenant.name.clone()),
                nodes,
            });
        }
        let tier = self.tiers.get(&tenant.tier)?;
        Some(Pool {
            owner: PoolOwner::Tier(tier.name.clone()),
            nodes: tier.nodes.as_ref()?,
        })
    }

    /// Why a job of `tenant` may not run on `node`, or `None` when it may: a tenant with a pool
    /// runs inside it; nobody runs in a pool that is not theirs (their own or their tier's).
    pub fn node_refusal(&self, tenant: &str, node: &str) -> Option<String> {
        let t = self.tenants.get(tenant)?;
        if let Some(own) = self.pool_of(t) {
            if !own.nodes.contains(node) {
                return Some(format!(
                    "node {node} is outside the node pool of tenant '{tenant}' ({} runs on {})",
                    own.owner, own.nodes
                ));
            }
        }
        let mine = |o: &PoolOwner| match o {
            PoolOwner::Tenant(n) => *n == t.name,
            PoolOwner::Tier(n) => *n == t.tier,
        };
        self.pools()
            .into_iter()
            .find(|p| !mine(&p.owner) && p.nodes.contains(node))
            .map(|p| {
                format!(
                    "node {node} is in the node pool of {} ({}), which tenant '{tenant}' may \
                     not use",
                    p.owner, p.nodes
                )
            })
    }

    /// Whether any tier or tenant has a node pool.
    pub fn has_pools(&self) -> bool {
        self.tiers.values().any(|t| t.nodes.is_some())
            || self.tenants.values().any(|t| t.nodes.is_some())
    }
}

impl Validator<'_> {
    /// A `nodes` key: a hostlist that parses and, with slurm.conf at hand, names its nodes.
    pub(crate) fn pool(&mut self, raw: &Option<Spanned<String>>, whose: &str) -> Option<Hostlist> {
        let raw = raw.as_ref()?;
        let list = match Hostlist::parse(raw.get_ref()) {
            Ok(l) => l,
            Err(e) => {
                self.problem(raw, format!("{whose}: nodes {e}"));
                return None;
            }
        };
        if let Some(slurm) = self.slurm {
            let unknown = slurm.unknown_nodes(&list);
            if !unknown.is_empty() {
                let msg = format!(
                    "{whose}: nodes \"{list}\" names {} that {} does not have: {}",
                    if unknown.len() == 1 {
                        "a node"
                    } else {
                        "nodes"
                    },
                    slurm.path.display(),
                    crate::hostlist::compress(&unknown)
                );
                self.problem(raw, msg);
            }
        }
        Some(list)
    }

    /// A `limits` table; MIG profiles must be ones `tier` offers.
    pub(crate) fn limits(
        &mut self,
        raw: &Spanned<RawLimits>,
        whose: &str,
        tier: &str,
        offered: &[String],
    ) -> Limits {
        let l = raw.get_ref();
        let mut mig_slices = BTreeMap::new();
        for (p, n) in &l.mig_slices {
            let profile = p.get_ref();
            if !crate::valid_profile(profile) {
                self.problem(
                    p,
                    format!(
                        "{whose}: limits.mig_slices \"{profile}\" is not a MIG profile; write it \
                         as NVML names it, e.g. 1g.18gb"
                    ),
                );
            } else if !offered.iter().any(|o| o == profile) {
                let msg = format!(
                    "{whose}: limits.mig_slices names profile '{profile}', which tier '{tier}' \
                     does not offer ({}): no job of it could use that quota",
                    if offered.is_empty() {
                        "it offers no MIG slices".to_string()
                    } else {
                        format!("it offers {}", offered.join(", "))
                    }
                );
                self.problem(p, msg);
            }
            mig_slices.insert(profile.clone(), *n);
        }
        let limits = Limits {
            gpus: l.gpus,
            mig_slices,
            nodes: l.nodes,
            running_jobs: l.running_jobs,
        };
        if limits.is_empty() {
            self.problem(
                raw,
                format!(
                    "{whose}: limits is empty: set gpus, mig_slices, nodes or running_jobs (or \
                     leave the table out)"
                ),
            );
        }
        limits
    }

    /// Each tenant's limit account is named after it: that name must not be another tenant's
    /// account, or slurmdbd's tree would mix the two.
    pub(crate) fn limit_accounts(
        &mut self,
        raw: &BTreeMap<Spanned<String>, RawTenant>,
        tenants: &BTreeMap<String, Tenant>,
    ) {
        for (name, t) in raw {
            let clash = tenants
                .values()
                .find(|o| o.name != *name.get_ref() && o.accounts.contains(name.get_ref()));
            if let Some(other) = clash {
                let msg = format!(
                    "tenant '{}' is also an account of tenant '{}': each tenant's quota is kept \
                     on an account named after it; rename the account or the tenant",
                    name.get_ref(),
                    other.name
                );
                self.problem(&t.tier, msg);
            }
        }
    }
}
