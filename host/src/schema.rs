//! JSON Schemas derived from the types: of the gateway's configuration
//! (`aura-gateway config schema`) and of each default plugin's own `config`
//! (`aura-gateway plugin schema --stage <stage>`), so that a console can render and check forms.

use crate::config::Config;
use crate::policy::Stage;

/// The JSON Schema of the configuration file (every key, its type, default and description).
pub fn config_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(Config)).unwrap_or_default()
}

/// The JSON Schema of the `config` table of a default plugin.
pub fn plugin_config_schema(stage: Stage) -> serde_json::Value {
    crate::policy::stages::config_schema(stage)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key of `value` (a configuration as JSON) is described by `schema`; returns how
    /// many keys were found described.
    fn described(
        schema: &serde_json::Value,
        root: &serde_json::Value,
        value: &serde_json::Value,
        at: &str,
    ) -> usize {
        let Some(map) = value.as_object() else {
            return 0;
        };
        let mut found = 0;
        let schema = resolve(root, schema);
        let properties = schema["properties"].as_object();
        for (key, v) in map {
            let Some(property) = properties.and_then(|p| p.get(key)) else {
                // Free-form maps (a plugin's `config`) are described as objects of any keys.
                assert!(
                    schema.get("additionalProperties").is_some() || schema.get("type").is_none(),
                    "{at}.{key} is not in the schema"
                );
                continue;
            };
            let property = resolve(root, property);
            assert!(
                property.get("description").is_some()
                    || property.get("$ref").is_some()
                    || property.get("allOf").is_some()
                    || property.get("anyOf").is_some(),
                "{at}.{key} has no description"
            );
            found += 1 + described(property, root, v, &format!("{at}.{key}"));
        }
        found
    }

    fn resolve<'a>(
        root: &'a serde_json::Value,
        schema: &'a serde_json::Value,
    ) -> &'a serde_json::Value {
        if let Some(reference) = schema["$ref"].as_str()
            && let Some(name) = reference.strip_prefix("#/$defs/")
        {
            return &root["$defs"][name];
        }
        if let Some(first) = schema["allOf"].get(0).or_else(|| schema["anyOf"].get(0))
            && first.get("$ref").is_some()
        {
            return resolve(root, first);
        }
        schema
    }

    #[test]
    fn the_config_schema_describes_every_key_of_the_configuration() {
        let schema = config_schema();
        assert!(
            schema["$schema"]
                .as_str()
                .is_some_and(|s| s.contains("json-schema.org"))
        );
        let config = serde_json::to_value(Config::default()).expect("json");
        let found = described(&schema, &schema, &config, "config");
        // Every section and the keys in it (about 150 today), not only the top level.
        assert!(found > 120, "only {found} keys found in the schema");
        let server = resolve(&schema, &schema["properties"]["server"]);
        let drain = &server["properties"]["drain_delay_secs"];
        assert!(
            drain["description"]
                .as_str()
                .is_some_and(|d| d.contains("SIGTERM")),
            "{drain}"
        );
        assert_eq!(drain["default"], 0);
    }

    #[test]
    fn each_default_plugin_publishes_the_schema_of_its_config() {
        for (stage, key) in [
            (Stage::ApiKey, "query_paths"),
            (Stage::Cors, "allow_origins"),
            (Stage::Quota, "plans"),
            (Stage::DbRouting, "nats_prefixes"),
        ] {
            let schema = plugin_config_schema(stage);
            assert!(
                schema["properties"].get(key).is_some(),
                "{stage}: no `{key}` in {schema}"
            );
            // Unknown keys are refused by the plugins: the schema says so.
            assert_eq!(schema["additionalProperties"], false, "{stage}");
        }
    }
}
