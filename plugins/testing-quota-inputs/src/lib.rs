//! A hostile `quota` stage plugin (`aura:gateway@0.4.0`) for the gateway's tests. Not shipped in
//! the binary.
//!
//! `configure` names the request headers and JWT claims of its configuration (`headers`,
//! `claims`), whatever they are: credential headers included, which the host must refuse.
//! It declares nothing, so it is called on every request. `decide`, by the end of the path:
//! - `…/retry/<n>`: `deny(429, quota-exceeded)` with `Retry-After` `n` seconds (`u32::MAX` when
//!   `n` is not a number), passed on unchecked (the host keeps it within 1 and 3600);
//! - `…/forbid`: `deny(403, policy-denied)`;
//! - `…/route-group`: `deny(429, quota-exceeded)` with `Retry-After` the index of the request's
//!   `route-group` case in `0.4.0`'s enum plus one (`auth` 1, `db` 2, `storage` 3, …);
//! - `…/scope-user` and `…/scope-client-ip`: a rule of that scope, for requests that may have
//!   no such value;
//! - anything else: checks what the host passed against the WIT's bounds and traps when any is
//!   broken (more than 16 header values, a value over 256 bytes, a name that `configure` did
//!   not answer); denies `403 policy-denied` when a header or claim value is `deny-me`; else a
//!   rule per key (exempt without a key).
//!
//! `config-schema` answers the schema chosen by [`SCHEMA_CHOICE`], a marker the tests rewrite in
//! the built module (a hostile uploader's edit): see [`schema`].

#[cfg(target_arch = "wasm32")]
mod component;

/// The marker the tests rewrite, byte for byte: the digit after `schema:` picks the schema,
/// the five after `port=` the port of the remote reference.
pub static SCHEMA_CHOICE: [u8; 32] = *b"aura-hostile-schema:0:port=00000";

/// The most header values and bytes of a value the WIT allows the host to pass.
pub const MAX_HEADER_VALUES: usize = 16;
/// The longest value the host may pass.
pub const MAX_VALUE_BYTES: usize = 256;

/// The schema `config-schema` answers for the marker `choice`:
/// - `0`: none;
/// - `1`: text that is not JSON;
/// - `2`: a reference to `http://127.0.0.1:<port>/schema.json` (never to be fetched);
/// - `3`: a schema of 70,000 bytes;
/// - `4`: a pattern that backtracks catastrophically on other engines, for the key `name`;
/// - `5`: a reference to itself (a cycle);
/// - `6`: 3,000 nested `items`.
pub fn schema(choice: &[u8; 32]) -> Option<String> {
    let port = std::str::from_utf8(&choice[27..32]).unwrap_or("0");
    match choice[20] {
        b'1' => Some(r#"{"type": "object", "properties": "#.to_owned()),
        b'2' => Some(format!(
            r#"{{"$ref": "http://127.0.0.1:{port}/schema.json"}}"#
        )),
        b'3' => Some(format!(r#"{{"description": "{}"}}"#, "x".repeat(70_000))),
        b'4' => Some(
            r#"{"type": "object", "properties": {"name": {"type": "string", "pattern": "^(a+)+$"}}}"#
                .to_owned(),
        ),
        b'5' => Some(r##"{"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}"##.to_owned()),
        b'6' => Some(format!(
            "{}{{}}{}",
            r#"{"items": "#.repeat(3_000),
            "}".repeat(3_000)
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_choice_answers_its_schema() {
        let mut choice = SCHEMA_CHOICE;
        assert_eq!(schema(&choice), None);
        choice[20] = b'2';
        choice[27..32].copy_from_slice(b"40123");
        assert!(schema(&choice).is_some_and(|s| s.contains("127.0.0.1:40123")));
        choice[20] = b'3';
        assert!(schema(&choice).is_some_and(|s| s.len() > 64 * 1024));
        choice[20] = b'6';
        assert!(schema(&choice).is_some_and(|s| s.starts_with(r#"{"items": {"items""#)));
    }
}
