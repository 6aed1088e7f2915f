//! A gateway binary in front of recording backends, for what reaches them: storage, realtime and
//! a dedicated project's PostgREST over HTTP, NATS responders for the rest; raw requests sent to
//! it on connections of their own.

use uuid::Uuid;

use super::builder::{Gateway, Started};
use super::fixture::Fixture;
use super::gateway::Process;
use super::raw::{exchange, get};
use super::responder::{Envelopes, reply};
use super::upstream::Recorder;

/// An extra project `ded` of organization A with a dedicated PostgREST at `postgrest`, and its
/// anon key.
fn dedicated(fx: &Fixture, postgrest: &str) -> (String, String) {
    let key = format!("aura_pk_ded_{}", Uuid::new_v4().simple());
    let records = format!(
        "[[projects]]\nref = \"ded\"\norganization_id = \"{org}\"\ndb_engine = \"postgres\"\ntopology = \"dedicated\"\npostgrest_url = \"{postgrest}\"\n\n\
         [[projects]]\nref = \"far\"\norganization_id = \"{org}\"\ndb_engine = \"postgres\"\ntopology = \"dedicated\"\npostgrest_url = \"http://10.255.255.1:3000\"\n\n\
         [[api_keys]]\nid = \"{id}\"\nproject_ref = \"ded\"\nrole = \"anon\"\nkey_sha256 = \"{hash}\"\n\n\
         [[api_keys]]\nid = \"{id2}\"\nproject_ref = \"far\"\nrole = \"anon\"\nkey_sha256 = \"{hash2}\"\n",
        org = fx.org_a,
        id = Uuid::new_v4(),
        id2 = Uuid::new_v4(),
        hash = aura_gateway::auth::keys::hash_key(&key),
        hash2 = aura_gateway::auth::keys::hash_key(&format!("{key}_far")),
    );
    (records, key)
}

/// A gateway binary over a fixture's records and two dedicated projects (`ded`, its PostgREST
/// a recorder; `far`, its PostgREST outside the allowed targets), in front of recording storage,
/// realtime and PostgREST backends and of NATS responders for `db`, `auth` and `functions` that
/// answer `nats`.
pub(crate) struct Edge {
    pub(crate) gw: Process,
    pub(crate) fx: Fixture,
    pub(crate) storage: Recorder,
    pub(crate) realtime: Recorder,
    pub(crate) postgrest: Recorder,
    envelopes: Envelopes,
    pub(crate) ded_key: String,
}

impl Edge {
    /// Started with `extra_toml` after the `[upstreams]` table.
    pub(crate) async fn start(extra_toml: &str) -> Self {
        let fx = Fixture::new();
        let (storage, realtime, postgrest) = (
            Recorder::start().await,
            Recorder::start().await,
            Recorder::start().await,
        );
        let (records, ded_key) = dedicated(&fx, &postgrest.url);
        let (storage_url, realtime_url) = (&storage.url, &realtime.url);
        let upstreams = format!(
            "[upstreams]\nstorage_url = \"{storage_url}\"\nrealtime_url = \"{realtime_url}\"\npostgrest_allowed_targets = [\"127.0.0.0/8\"]\n\n{extra_toml}",
        );
        let gw = Gateway::builder()
            .fixture(&fx)
            .records(records)
            .toml(upstreams);
        let bus = crate::support::responder::Bus::shared();
        let envelopes = bus.record(&["db", "auth", "functions"], |_| reply(200, &[], b"nats"));
        let envelopes = envelopes.await;
        let Started { gw, .. } = gw.bus(&bus).binary();
        Self {
            gw,
            fx,
            storage,
            realtime,
            postgrest,
            envelopes,
            ded_key,
        }
    }

    /// `raw` sent on a connection of its own to the data plane: what came back.
    pub(crate) async fn data(&self, raw: Vec<u8>) -> String {
        exchange(self.gw.port, raw).await
    }

    /// `raw` sent on a connection of its own to the management plane: what came back.
    pub(crate) async fn mgmt(&self, raw: Vec<u8>) -> String {
        exchange(self.gw.management_port, raw).await
    }

    /// `GET path` with the key of project `ded` on the data plane: what came back.
    pub(crate) async fn get_ded(&self, path: &str) -> String {
        self.data(get(path, &[("apikey", &self.ded_key)])).await
    }

    /// The envelopes the NATS responders received.
    pub(crate) fn envelopes(&self) -> Vec<serde_json::Value> {
        self.envelopes.seen()
    }
}
