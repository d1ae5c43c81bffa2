//! What a job's request may hold, checked the same way by slurmctld's job_submit/tenancy and by
//! the prolog (job/src/context.rs): a value one of them refuses, the other refuses with the same
//! words, so a job the controller accepted is never refused on the node for its request alone
//! (which would drain the node).

/// Longest value taken from a job's environment: real values are short; a huge one is an attack.
pub const MAX_VALUE: usize = 4096;

/// Longest user, account, node, cluster or partition name taken.
pub const MAX_NAME: usize = 128;

/// A job environment value as text: `Ok(None)` when empty. The error says what is wrong, for
/// the caller to put after the variable's name.
pub fn env_text(raw: &[u8]) -> Result<Option<String>, String> {
    if raw.len() > MAX_VALUE {
        return Err(format!("is {} bytes long (at most {MAX_VALUE})", raw.len()));
    }
    let s = std::str::from_utf8(raw).map_err(|_| "is not valid UTF-8".to_string())?;
    if s.chars().any(char::is_control) {
        return Err(format!("contains control characters: {}", s.escape_debug()));
    }
    Ok((!s.is_empty()).then(|| s.to_string()))
}

/// Why `s` is not a name as Slurm and NSS give them for users, accounts, nodes, clusters and
/// partitions, or `None` when it is one. Letters, digits, `_ - . $` and `@` (sssd gives user
/// names qualified with their domain, `jdoe@example.org`), not starting with `-` or `.`.
pub fn name_problem(s: &str) -> Option<String> {
    let shown = || {
        let mut e: String = s
            .chars()
            .take(40)
            .collect::<String>()
            .escape_debug()
            .to_string();
        if s.chars().count() > 40 {
            e.push_str("...");
        }
        e
    };
    if s.is_empty() {
        return Some("is empty".into());
    }
    if s.len() > MAX_NAME {
        return Some(format!(
            "is not a plain name: '{}' is {} bytes long (at most {MAX_NAME})",
            shown(),
            s.len()
        ));
    }
    let ok = !s.starts_with(['-', '.'])
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'$' | b'@'));
    (!ok).then(|| {
        format!(
            "is not a plain name: '{}' (letters, digits, '_', '-', '.', '$' and '@', not \
             starting with '-' or '.')",
            shown()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_slurm_and_nss_give_are_plain() {
        for ok in ["alice", "jdoe@example.org", "acme-a", "svc_1$", "a.b", "A1"] {
            assert_eq!(name_problem(ok), None, "{ok}");
        }
        for (bad, want) in [
            ("bad acct", "is not a plain name: 'bad acct'"),
            ("-x", "not starting"),
            (".x", "not starting"),
            ("a/b", "a/b"),
            ("", "is empty"),
        ] {
            let p = name_problem(bad).unwrap();
            assert!(p.contains(want), "{bad}: {p}");
        }
        let long = "a".repeat(200);
        assert!(name_problem(&long)
            .unwrap()
            .contains("200 bytes long (at most 128)"));
    }

    #[test]
    fn env_values_are_checked_for_transport() {
        assert_eq!(env_text(b""), Ok(None));
        assert_eq!(env_text(b"acme"), Ok(Some("acme".into())));
        assert!(env_text(b"\xff").unwrap_err().contains("UTF-8"));
        assert!(env_text(b"a\nb").unwrap_err().contains("control"));
        assert!(env_text(&[b'a'; 5000]).unwrap_err().contains("5000 bytes"));
    }
}
