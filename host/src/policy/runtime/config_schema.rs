//! A module's configuration schema (`config-schema`, `aura:gateway@0.3.0` and later), checked before the
//! module's `configure` sees its configuration.
//!
//! The schema is the module's, so it is hostile like the rest of it: its size is bounded
//! ([`MAX_SCHEMA_BYTES`]), references are never fetched (no network, no files: only the
//! schema's own `$defs`), and its patterns run on a regular-expression engine without
//! backtracking, so no pattern can make the check run away.

/// The largest configuration schema a module may answer, in bytes.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// How many violations a refusal names.
const NAMED_VIOLATIONS: usize = 3;

/// Checks `config` (JSON text, `{}` when empty) against `schema`. The outer error says the
/// schema itself is unusable (the module's fault); the inner one names what the configuration
/// breaks.
pub(crate) fn check(schema: &str, config: &str) -> Result<Result<(), String>, String> {
    let schema = parse_schema(schema)?;
    let validator = jsonschema::options()
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .build(&schema)
        .map_err(|e| format!("config-schema answered an invalid schema: {e}"))?;
    let config: serde_json::Value = if config.trim().is_empty() {
        serde_json::json!({})
    } else {
        match serde_json::from_str(config) {
            Ok(value) => value,
            Err(e) => return Ok(Err(format!("the configuration is not JSON: {e}"))),
        }
    };
    let violations: Vec<String> = validator
        .iter_errors(&config)
        .take(NAMED_VIOLATIONS + 1)
        .map(|e| {
            let at = e.instance_path().to_string();
            let at = if at.is_empty() { "/".to_owned() } else { at };
            format!("{at}: {e}")
        })
        .collect();
    if violations.is_empty() {
        return Ok(Ok(()));
    }
    let more = if violations.len() > NAMED_VIOLATIONS {
        " (and more)"
    } else {
        ""
    };
    Ok(Err(format!(
        "the configuration does not satisfy the module's schema: {}{more}",
        violations[..violations.len().min(NAMED_VIOLATIONS)].join("; ")
    )))
}

/// The schema as JSON, bounded.
pub(crate) fn parse_schema(schema: &str) -> Result<serde_json::Value, String> {
    if schema.len() > MAX_SCHEMA_BYTES {
        return Err(format!(
            "config-schema answered {} bytes, over the {MAX_SCHEMA_BYTES} allowed",
            schema.len()
        ));
    }
    serde_json::from_str(schema).map_err(|e| format!("config-schema answered invalid JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &str = r#"{
        "type": "object",
        "properties": {
            "rate_per_second": {"type": "integer", "minimum": 1},
            "name": {"type": "string", "pattern": "^[a-z]+$"}
        },
        "additionalProperties": false
    }"#;

    #[test]
    fn a_configuration_is_checked_and_its_violations_named() {
        assert_eq!(check(SCHEMA, r#"{"rate_per_second": 5}"#), Ok(Ok(())));
        assert_eq!(check(SCHEMA, ""), Ok(Ok(())), "no configuration is {{}}");
        let refused = check(SCHEMA, r#"{"rate_per_second": 0, "extra": 1}"#)
            .expect("schema usable")
            .expect_err("refused");
        assert!(refused.contains("/rate_per_second"), "{refused}");
        assert!(refused.contains("extra"), "{refused}");
        let not_json = check(SCHEMA, "{")
            .expect("schema usable")
            .expect_err("refused");
        assert!(not_json.contains("not JSON"), "{not_json}");
    }

    #[test]
    fn a_hostile_schema_is_refused_or_bounded() {
        let huge = format!(r#"{{"description": "{}"}}"#, "x".repeat(MAX_SCHEMA_BYTES));
        assert!(check(&huge, "{}").expect_err("too big").contains("bytes"));
        assert!(check("not json", "{}").is_err());
        assert!(check(r#"{"type": 7}"#, "{}").is_err(), "invalid schema");
        // A remote reference is never fetched: the schema is refused instead.
        let remote = r#"{"$ref": "http://169.254.169.254/latest/meta-data"}"#;
        assert!(check(remote, "{}").is_err());
        // A pattern that backtracks catastrophically elsewhere (2^10000 paths for this input)
        // runs in linear time here: the check returns at all, and refuses the value.
        let evil = r#"{"properties": {"a": {"type": "string", "pattern": "^(a+)+$"}}}"#;
        let input = format!(r#"{{"a": "{}!"}}"#, "a".repeat(10_000));
        assert!(check(evil, &input).expect("usable").is_err());
        // Nesting past the JSON parser's depth is refused as JSON, never a stack overflow.
        let nested = format!("{}{{}}{}", r#"{"items": "#.repeat(3_000), "}".repeat(3_000));
        let refused = check(&nested, "[]").expect_err("too deep");
        assert!(refused.contains("invalid JSON"), "{refused}");
        // A schema that refers to itself is answered (refused or checked), never a loop.
        let cycle = r##"{"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}"##;
        let _answered = check(cycle, r#"{"a": 1}"#);
    }
}
