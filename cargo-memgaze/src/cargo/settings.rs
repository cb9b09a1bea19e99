//! The `[package.metadata.memgaze]` table of a package's manifest: which
//! keys it may hold. A misspelt or unsupported key (`period = 10000`)
//! would otherwise be ignored without a word while the user believes it
//! applies.

use memgaze_error::usage;
use serde_json::Value;
use std::path::Path;

/// The keys `[package.metadata.memgaze]` accepts (each documented in
/// docs/CLI.md).
pub const KNOWN_KEYS: &[&str] = &["limits"];

/// Checks the `memgaze` table of a package's `metadata` (cargo_metadata's
/// JSON, the whole `[package.metadata]` value): absent, or a table of
/// [`KNOWN_KEYS`]. Errors are usage errors (exit 2) naming the manifest
/// and the key.
pub fn check_settings(metadata: &Value, manifest: &Path) -> anyhow::Result<()> {
    let Some(table) = metadata.get("memgaze") else {
        return Ok(());
    };
    let Value::Object(table) = table else {
        return Err(usage(format!(
            "{}: [package.metadata.memgaze] must be a table, found {table}",
            manifest.display()
        )));
    };
    match table.keys().find(|key| !KNOWN_KEYS.contains(&key.as_str())) {
        None => Ok(()),
        Some(key) => Err(usage(format!(
            "{}: [package.metadata.memgaze]: unknown key `{key}` (known keys: {}; command-line settings such as --period are not read from the manifest)",
            manifest.display(),
            KNOWN_KEYS.join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memgaze_error::{Exit, exit_for, one_line};
    use serde_json::json;

    #[test]
    fn known_keys_pass_and_unknown_ones_are_usage_errors_naming_them() {
        let manifest = Path::new("/w/app/Cargo.toml");
        for ok in [
            json!(null),
            json!({"other-tool": {"period": 1}}),
            json!({"memgaze": {}}),
            json!({"memgaze": {"limits": "dF=+5%"}}),
        ] {
            check_settings(&ok, manifest).unwrap();
        }
        let e = check_settings(
            &json!({"memgaze": {"limits": "dF=+5%", "period": 10000}}),
            manifest,
        )
        .unwrap_err();
        assert_eq!(exit_for(&e), Exit::Usage);
        assert!(
            one_line(&e).starts_with(
                "/w/app/Cargo.toml: [package.metadata.memgaze]: unknown key `period` (known keys: limits"
            ),
            "{}",
            one_line(&e)
        );
        let e = check_settings(&json!({"memgaze": 3}), manifest).unwrap_err();
        assert_eq!(exit_for(&e), Exit::Usage);
        assert!(one_line(&e).contains("must be a table, found 3"));
    }
}
