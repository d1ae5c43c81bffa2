//! A job's MIG request in one line, for the integration tests and the unit tests alike
//! (src/tests.rs includes this file by its path).

use super::Request;

pub fn req(profile: Option<&str>, slot: Option<u32>, tenant: &str, share: bool) -> Request {
    Request {
        profile: profile.map(Into::into),
        slot,
        tenant: tenant.into(),
        share_gpu: share,
    }
}
