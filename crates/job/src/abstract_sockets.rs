//! Abstract UNIX sockets between jobs (ARCHITECTURE.md, "Abstract UNIX sockets").
//!
//! Jobs share the node's network namespace, so an abstract UNIX socket (a name, no file) one
//! job listens on is outside every file permission, cgroup and nft rule. Landlock's scoping
//! (`LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`, Landlock ABI 6, Linux 6.12) closes it: a process in
//! a Landlock domain cannot connect to an abstract socket made by a process outside that domain
//! (or the domains nested in it). The domain is made once per slurmstepd, in the thread that
//! forks the step's tasks and task epilogs ([`scope_self`], called where slurmstepd joins its
//! job): every process of a step shares it, so the step's tasks reach each other's sockets (an
//! MPI or NCCL job's ranks on the node), while another step's, another job's and the node's own
//! abstract sockets are out of reach. A domain cannot be joined, only inherited, so two steps of
//! one job are two domains. An ssh session adopted into a job gets a domain of its own
//! (pam_tenancy). The domain scopes nothing else: no file, network or signal rule.
//!
//! On an older kernel nothing is applied and the gap stays as documented (`tenancyctl doctor`,
//! check `containment.abstract_sockets`, says which applies).

use landlock::{Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope};

/// The Landlock ABI that scopes abstract UNIX sockets.
pub const SCOPING_ABI: i32 = 6;

/// What [`scope_self`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scoping {
    /// The calling thread (and everything it forks from now on) is in a domain of its own.
    Applied,
    /// The kernel cannot scope abstract sockets (its Landlock ABI, or none): nothing applied.
    Unsupported,
}

/// The running kernel's Landlock ABI version; `None` without Landlock (not built in, or not
/// enabled by the `lsm=` boot list).
pub fn kernel_abi() -> Option<i32> {
    // LANDLOCK_CREATE_RULESET_VERSION: no ruleset, the ABI version as the return value.
    // SAFETY: a null attribute pointer and size 0 are what this flag takes.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    };
    (v > 0).then_some(v as i32)
}

/// Whether this kernel scopes abstract UNIX sockets (Landlock ABI [`SCOPING_ABI`] or later).
pub fn kernel_scopes() -> bool {
    kernel_abi().is_some_and(|abi| abi >= SCOPING_ABI)
}

/// Puts the calling thread into a new Landlock domain that scopes abstract UNIX sockets and
/// nothing else, without `no_new_privs` (the job's setuid programs keep working): every process
/// it forks afterwards inherits it. Needs CAP_SYS_ADMIN (slurmstepd and sshd run as root). A
/// kernel that cannot scope is [`Scoping::Unsupported`]; a kernel that can but refuses is an
/// error (the caller fails closed).
pub fn scope_self() -> Result<Scoping, String> {
    if !kernel_scopes() {
        return Ok(Scoping::Unsupported);
    }
    let status = Ruleset::default()
        .scope(Scope::AbstractUnixSocket)
        .and_then(|r| r.create())
        .map(|r| r.no_new_privs(false))
        .and_then(|r| r.restrict_self())
        .map_err(|e| format!("cannot scope abstract UNIX sockets with Landlock: {e}"))?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok(Scoping::Applied),
        other => Err(format!(
            "Landlock ABI {} should scope abstract UNIX sockets, but the domain is {other:?}",
            kernel_abi().unwrap_or(0)
        )),
    }
}
