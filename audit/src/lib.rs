//! tenancy-audit
