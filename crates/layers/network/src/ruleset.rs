//! Rendering of the product's nftables table (a pure function of the spec).
//!
//! Rule design (one `inet` table, nothing per job):
//!
//! * `output` (hook output): `socket cgroupv2 level L vmap { "<prefix>/<tenant>" : goto out_<id> }`
//!   sends packets of sockets created inside `tenancy/<tenant>/...` to the tenant's chain; all
//!   other sockets (slurmd, root, users outside jobs) match nothing and are accepted by policy.
//! * `out_<id>`: replies (`ct direction reply`) are accepted only on connections whose ct mark is
//!   the tenant's own id (a connection a job of the tenant opened, or one `in_<id>` stamped when
//!   it reached a socket of the tenant): a flow a remote host or a non-job process opened to
//!   anything else (mark 0) is no way out. The first packet of a connection gets
//!   `ct mark set <id>` (the sender's tenant). Broadcast and multicast destinations go to
//!   `deny_<id>` (the kernel delivers them to every socket bound to the port, while the input
//!   hook judges only the one its lookup finds). Protocols other than TCP, UDP and ICMP(v6)
//!   (UDP-Lite, SCTP, DCCP, raw IP), which no input hook's socket lookup sees, go to
//!   `deny_<id>` whatever the egress list says: neither this node nor another could tell
//!   which tenant's socket receives them. Local destinations (`fib daddr type local`:
//!   loopback and the node's own addresses) are accepted and judged at input. Then the
//!   tenant's egress list and the cluster's infrastructure list are accepted; everything else
//!   goes to `deny_<id>`.
//! * `input` (hook input): the receiving socket (listener or connected socket, found by the
//!   socket lookup of the input hook) is dispatched the same way to `in_<id>`, which stamps a new
//!   flow (ct mark 0: opened by a remote host or a non-job process) with the tenant's id, accepts
//!   the own id and sends other tenants' connections to the sender's deny chain via the
//!   `sender_deny` map (so attempts are counted for the tenant that made them).
//!   A packet whose receiving socket is not a tenant job's (a node daemon, no socket at all, or
//!   a protocol the lookup does not cover) and whose flow a tenant's job opened
//!   (`ct direction original`, ct mark = the tenant's id) goes to `local_<id>`: the tenant's
//!   egress and infrastructure lists are accepted, the rest (a ping of a node address too) goes
//!   to `deny_<id>`. An established TCP connection is accepted there: its first packet was
//!   judged, and later ones can meet a request or time-wait socket, whose cgroup the lookup
//!   cannot read. Flows with ct mark 0 are accepted by policy.
//! * slurmstepd's own sockets carry the mark [`crate::STEPD_MARK`] (stepd.rs: a socket program
//!   on the cgroup2 root stamps the sockets of threads with real uid 0 named `slurmstepd`).
//!   slurmstepd sits in its job's cgroup from `slurm_spank_init` on, so its sockets are the
//!   job's like any other: `out_<id>` stamps their flows with the tenant's ct mark and judges
//!   broadcast, protocol and source address as for the job's code; only then is a marked TCP or
//!   UDP flow accepted to any destination (the srun, sattach or salloc that asked for the step,
//!   wherever it runs; slurmctld; slurmd), where user code needs its egress list. On this node
//!   `local_<id>` accepts it the same way (a node address or loopback: the mark is on the
//!   packet), and another tenant's job receives it as the sender tenant's flow: dropped and
//!   counted for the sender. Across nodes it leaves from the tenant's address like any flow of
//!   the job. A marked flow with ct mark 0 (a slurmstepd that has not joined its job, or one of
//!   a job without isolation here) is dropped before it reaches a job's socket.
//! * `deny_<id>`: rate-limited `log prefix "tenancy drop <tenant>: "` and
//!   `counter name "drop_<tenant>" drop`.
//!
//! * Across nodes (`cross_node`, ARCHITECTURE.md "Across nodes: tenant identity on the wire"):
//!   each tenant has one address on every node (its prefix plus the node's index). `out_<id>`
//!   sends a packet whose source is another tenant's address (a job's socket bound to it) to
//!   `deny_<id>` and accepts the tenant's own prefix (its jobs on other nodes); the nat chain
//!   `postrouting` rewrites the source of every new flow a job opens into the cluster (`@cluster`:
//!   the node network and every tenant prefix) to its tenant's address on this node
//!   (`@tenant_address`, keyed by the ct mark `out_<id>` stamped). `in_<id>` admits a new flow
//!   from a tenant address only from its own prefix and sends another tenant's to that
//!   tenant's deny chain (`@tenant_of_source`); a new flow to a tenant address that no job of
//!   that tenant receives is dropped. A flow no job opened (ct mark 0) whose source is a tenant
//!   address (bound, or chosen by the kernel for an on-link tenant prefix) is rewritten to the
//!   node's own address: outside jobs nothing speaks as a tenant.
//!
//! Adding a job is creating `tenancy/<tenant>/job_<id>`: the rules match the tenant ancestor,
//! so the table never changes per job.

use std::fmt::Write;

use crate::{
    validate_spec, AnchoredJob, CrossNode, Error, FirewallSpec, Result, TenantNet, STEPD_MARK,
};

/// The only IP protocols a job may send, IPv4 and IPv6 alike: those whose receiving socket the
/// input hook can find (TCP, UDP) and ICMP. The kernel's socket lookup does not cover UDP-Lite,
/// SCTP, DCCP or raw IP, so no node, this one or another, could tell which tenant's job gets
/// such a packet: they are dropped whatever the egress list says.
pub const JUDGED: &str = "{ tcp, udp, icmp, ipv6-icmp }";

/// What slurmstepd's own sockets may send besides what the job may: TCP (Slurm's protocol) and
/// UDP (name lookups).
pub const STEPD_PROTOCOLS: &str = "{ tcp, udp }";

/// Log lines per second per tenant (burst twice that); drops beyond it are counted, not logged.
pub const LOG_RATE_PER_SEC: u32 = 10;

/// Name of the per-tenant drop counter.
pub fn counter_name(tenant: &str) -> String {
    format!("drop_{tenant}")
}

/// The nft script of the product's own table, as loaded by [`crate::apply`] (without the
/// leading delete that makes the load a replacement).
pub fn ruleset(spec: &FirewallSpec) -> Result<String> {
    ruleset_keeping(spec, &[])
}

/// [`ruleset`] with the elements of running jobs in the jobs maps (pure cgroup v2), so that a
/// replacement of the table keeps them in the same transaction.
pub fn ruleset_keeping(spec: &FirewallSpec, jobs: &[AnchoredJob]) -> Result<String> {
    validate_spec(spec)?;
    // Across nodes, with the node's own address (rendered only where it is known).
    let cross = match &spec.cross_node {
        Some(_) if spec.tenants.is_empty() => None,
        Some(c) if c.node.is_some() => Some(c),
        Some(_) => {
            return Err(Error::Invalid(
                "the cross-node rules need this node's address in node_network: render them \
                 through `tenancyctl firewall apply` or `firewall show --rules` on the node"
                    .into(),
            ))
        }
        None => None,
    };
    let mut s = String::new();
    let w = &mut s;
    // Writing to a String cannot fail.
    let _ = writeln!(
        w,
        "# Generated by tenancy-network: `tenancyctl firewall apply` replaces this table atomically."
    );
    let _ = writeln!(w, "table inet {} {{", spec.table_name);
    for t in &spec.tenants {
        let _ = writeln!(w, "\tcounter {} {{\n\t}}\n", counter_name(&t.name));
    }
    if crate::anchored_level(spec).is_some() {
        write_jobs_maps(w, spec, jobs)?;
    }
    write_sender_deny(w, spec);
    if let Some(c) = cross {
        write_cross_sets(w, spec, c);
    }
    for t in &spec.tenants {
        // Across nodes: the tenant's prefix and its address on this node.
        let own = cross.map(|c| {
            (
                c.prefix(&t.name).expect("validated").to_string(),
                c.address(&t.name).expect("validated").to_string(),
            )
        });
        let own = own.as_ref().map(|(p, a)| (p.as_str(), a.as_str()));
        write_deny_chain(w, t);
        write_out_chain(w, spec, t, own);
        write_local_chain(w, spec, t);
        write_in_chain(w, t, own.map(|(p, _)| p));
    }
    for (hook, prefix) in [("output", "out"), ("input", "in")] {
        write_hook_chain(w, spec, hook, prefix, cross.is_some());
    }
    if let Some(c) = cross {
        write_postrouting(
            w,
            &c.node.as_ref().expect("checked above").address.to_string(),
        );
    }
    let _ = writeln!(w, "}}");
    Ok(s)
}

/// Jobs anchored in Slurm's job folders (pure cgroup v2): one element per job, added by the
/// prolog and deleted by the epilog by cgroup id (netlink). `firewall apply` renders the
/// running jobs' elements here (by path: nft names cgroups so), checked by
/// `crate::apply_keeping`.
fn write_jobs_maps(w: &mut String, spec: &FirewallSpec, jobs: &[AnchoredJob]) -> Result<()> {
    for (map, chain) in [(crate::JOBS_OUT, "out"), (crate::JOBS_IN, "in")] {
        let _ = writeln!(w, "\tmap {map} {{\n\t\ttype cgroupsv2 : verdict");
        let elems = jobs
            .iter()
            .map(|j| {
                Ok(format!(
                    "\"{}\" : goto {chain}_{}",
                    j.nft_path()?,
                    spec.tenant(&j.tenant)?.id
                ))
            })
            .collect::<Result<Vec<String>>>()?;
        if !elems.is_empty() {
            let _ = writeln!(w, "\t\telements = {{ {} }}", elems.join(", "));
        }
        let _ = writeln!(w, "\t}}\n");
    }
    Ok(())
}

/// The sending tenant's deny chain, by the flow's ct mark.
fn write_sender_deny(w: &mut String, spec: &FirewallSpec) {
    let _ = writeln!(w, "\tmap sender_deny {{");
    let _ = writeln!(w, "\t\ttype mark : verdict");
    if !spec.tenants.is_empty() {
        let elems: Vec<String> = spec
            .tenants
            .iter()
            .map(|t| format!("{} : goto deny_{}", t.id, t.id))
            .collect();
        let _ = writeln!(w, "\t\telements = {{ {} }}", elems.join(", "));
    }
    let _ = writeln!(w, "\t}}\n");
}

/// A tenant's drops: logged at a bounded rate and counted.
fn write_deny_chain(w: &mut String, t: &TenantNet) {
    let id = t.id;
    let _ = writeln!(w, "\tchain deny_{id} {{");
    let _ = writeln!(
        w,
        "\t\tlimit rate {LOG_RATE_PER_SEC}/second burst {} packets log prefix \"tenancy drop {}: \"",
        LOG_RATE_PER_SEC * 2,
        t.name
    );
    let _ = writeln!(w, "\t\tcounter name \"{}\" drop", counter_name(&t.name));
    let _ = writeln!(w, "\t}}\n");
}

/// What a tenant's jobs send: their flows marked as the tenant's; `own` across nodes (the
/// tenant's prefix, its address on this node).
fn write_out_chain(w: &mut String, spec: &FirewallSpec, t: &TenantNet, own: Option<(&str, &str)>) {
    let id = t.id;
    let _ = writeln!(w, "\tchain out_{id} {{");
    let _ = writeln!(w, "\t\tct direction reply ct mark {id} accept");
    let _ = writeln!(w, "\t\tct direction reply goto deny_{id}");
    let _ = writeln!(w, "\t\tct mark != {{ 0, {id} }} goto deny_{id}");
    let _ = writeln!(w, "\t\tct mark set {id}");
    let _ = writeln!(
        w,
        "\t\tfib daddr type {{ broadcast, multicast }} goto deny_{id}"
    );
    let _ = writeln!(w, "\t\tmeta l4proto != {JUDGED} goto deny_{id}");
    if let Some((_, addr)) = own {
        let _ = writeln!(
            w,
            "\t\tip saddr @tenant_space ip saddr != {addr} goto deny_{id}"
        );
    }
    let _ = writeln!(w, "\t\tfib daddr type local accept");
    if let Some((prefix, _)) = own {
        let _ = writeln!(w, "\t\tip daddr {prefix} accept");
    }
    write_stepd(w);
    write_allowed(w, spec, t);
    let _ = writeln!(w, "\t\tgoto deny_{id}");
    let _ = writeln!(w, "\t}}\n");
}

/// What a tenant's jobs receive from processes of this node outside every job.
fn write_local_chain(w: &mut String, spec: &FirewallSpec, t: &TenantNet) {
    let id = t.id;
    let _ = writeln!(w, "\tchain local_{id} {{");
    let _ = writeln!(w, "\t\tmeta l4proto != {JUDGED} goto deny_{id}");
    let _ = writeln!(w, "\t\tmeta l4proto tcp ct state established accept");
    write_stepd(w);
    write_allowed(w, spec, t);
    let _ = writeln!(w, "\t\tgoto deny_{id}");
    let _ = writeln!(w, "\t}}\n");
}

/// What a tenant's jobs receive: their own tenant's flows; `prefix` across nodes.
fn write_in_chain(w: &mut String, t: &TenantNet, prefix: Option<&str>) {
    let id = t.id;
    let _ = writeln!(w, "\tchain in_{id} {{");
    // A slurmstepd outside every job speaks for no tenant: none of its flows is a job's.
    let _ = writeln!(w, "\t\tct mark 0 meta mark {STEPD_MARK:#x} drop");
    if let Some(prefix) = prefix {
        let _ = writeln!(w, "\t\tct mark 0 ip saddr {prefix} ct mark set {id} accept");
        let _ = writeln!(w, "\t\tct mark 0 ip saddr vmap @tenant_of_source");
    }
    let _ = writeln!(w, "\t\tct mark 0 ct mark set {id} accept");
    let _ = writeln!(w, "\t\tct mark {id} accept");
    let _ = writeln!(w, "\t\tct mark vmap @sender_deny");
    let _ = writeln!(w, "\t\tgoto deny_{id}");
    let _ = writeln!(w, "\t}}\n");
}

/// The base chain of `hook` (output or input): a socket's tenant (or anchored job) sends its
/// packets to the tenant's `prefix_<id>` chain.
fn write_hook_chain(w: &mut String, spec: &FirewallSpec, hook: &str, prefix: &str, cross: bool) {
    let level = spec.cgroup.tenant_level();
    let _ = writeln!(w, "\tchain {hook} {{");
    let _ = writeln!(
        w,
        "\t\ttype filter hook {hook} priority filter; policy accept;"
    );
    if !spec.tenants.is_empty() {
        let elems: Vec<String> = spec
            .tenants
            .iter()
            .map(|t| {
                format!(
                    "\"{}\" : goto {prefix}_{}",
                    spec.cgroup.nft_tenant_path(&t.name),
                    t.id
                )
            })
            .collect();
        let _ = writeln!(
            w,
            "\t\tsocket cgroupv2 level {level} vmap {{ {} }}",
            elems.join(", ")
        );
        if let Some(level) = crate::anchored_level(spec) {
            let map = if hook == "output" {
                crate::JOBS_OUT
            } else {
                crate::JOBS_IN
            };
            let _ = writeln!(w, "\t\tsocket cgroupv2 level {level} vmap @{map}");
        }
        if hook == "input" {
            let elems: Vec<String> = spec
                .tenants
                .iter()
                .map(|t| format!("{} : goto local_{}", t.id, t.id))
                .collect();
            let _ = writeln!(
                w,
                "\t\tct direction original ct mark vmap {{ {} }}",
                elems.join(", ")
            );
        }
    }
    if cross && hook == "input" {
        // A tenant's address receives only what its tenant's jobs receive.
        let _ = writeln!(
            w,
            "\t\tct direction original ct mark 0 ip daddr @tenant_space ip saddr vmap @tenant_of_source"
        );
        let _ = writeln!(
            w,
            "\t\tct direction original ct mark 0 ip daddr @tenant_space drop"
        );
    }
    let last = hook == "input" && !cross;
    let _ = writeln!(w, "\t}}{}", if last { "" } else { "\n" });
}

/// Across nodes: what leaves for another node speaks with its tenant's address (`node`: this
/// node's own).
fn write_postrouting(w: &mut String, node: &str) {
    let _ = writeln!(w, "\tchain postrouting {{");
    let _ = writeln!(
        w,
        "\t\ttype nat hook postrouting priority srcnat; policy accept;"
    );
    let _ = writeln!(w, "\t\toifname \"lo\" return");
    // A flow no job opened (a process outside every job, a slurmstepd that has not joined
    // its job) leaves from the node's own address even where it bound, or the kernel
    // chose, a tenant's: only a tenant's jobs speak as the tenant.
    let _ = writeln!(w, "\t\tct mark 0 ip saddr @tenant_space snat ip to {node}");
    let _ = writeln!(
        w,
        "\t\tip daddr @cluster snat ip to ct mark map @tenant_address"
    );
    let _ = writeln!(w, "\t}}");
}

/// The sets and maps of the cross-node rules (one element per tenant, nothing per job).
fn write_cross_sets(w: &mut String, spec: &FirewallSpec, c: &CrossNode) {
    let set = |w: &mut String, name: &str, ty: &str, interval: bool, elems: Vec<String>| {
        let _ = writeln!(w, "\t{name} {{");
        let _ = writeln!(w, "\t\ttype {ty}");
        if interval {
            let _ = writeln!(w, "\t\tflags interval");
        }
        let _ = writeln!(w, "\t\telements = {{ {} }}", elems.join(", "));
        let _ = writeln!(w, "\t}}\n");
    };
    let prefix = |t: &TenantNet| c.prefix(&t.name).expect("validated");
    set(
        w,
        "set tenant_space",
        "ipv4_addr",
        true,
        spec.tenants.iter().map(|t| prefix(t).to_string()).collect(),
    );
    set(
        w,
        "set cluster",
        "ipv4_addr",
        true,
        std::iter::once(c.node_network.to_string())
            .chain(spec.tenants.iter().map(|t| prefix(t).to_string()))
            .collect(),
    );
    set(
        w,
        "map tenant_of_source",
        "ipv4_addr : verdict",
        true,
        spec.tenants
            .iter()
            .map(|t| format!("{} : goto deny_{}", prefix(t), t.id))
            .collect(),
    );
    set(
        w,
        "map tenant_address",
        "mark : ipv4_addr",
        false,
        spec.tenants
            .iter()
            .map(|t| format!("{} : {}", t.id, c.address(&t.name).expect("validated")))
            .collect(),
    );
}

/// slurmstepd's own flows (marked by stepd.rs's socket program), once judged as the job's: to
/// any destination, for the srun, sattach or salloc that asked, wherever it listens.
fn write_stepd(w: &mut String) {
    let _ = writeln!(
        w,
        "\t\tmeta mark {STEPD_MARK:#x} meta l4proto {STEPD_PROTOCOLS} accept"
    );
}

/// Accept rules for the tenant's egress list and the cluster's infrastructure list.
fn write_allowed(w: &mut String, spec: &FirewallSpec, t: &TenantNet) {
    for d in t.egress.iter().chain(spec.infrastructure.iter()) {
        let _ = writeln!(w, "\t\t{} accept", d.nft_match());
    }
}

/// The full transaction [`crate::apply`] feeds to `nft -f -`: create-if-missing, delete, and
/// load, so the table is replaced in one atomic step and nothing outside it is touched.
pub fn replace_script(spec: &FirewallSpec) -> Result<String> {
    replace_script_keeping(spec, &[])
}

/// [`replace_script`] keeping running jobs' elements ([`ruleset_keeping`]).
pub fn replace_script_keeping(spec: &FirewallSpec, jobs: &[AnchoredJob]) -> Result<String> {
    let body = ruleset_keeping(spec, jobs)?;
    Ok(format!(
        "table inet {t}\ndelete table inet {t}\n{body}",
        t = spec.table_name
    ))
}
