//! One request to the gateway, as the tests make them: built with a key or a console token,
//! sent, its status checked, its body read.

use std::fmt::Debug;

use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::{Client, IntoUrl, Method, RequestBuilder, Response, StatusCode};
use serde_json::Value;
use uuid::Uuid;

use super::fixture::console_token;
use super::records::{TEST_CONSOLE_USER, TEST_KEY};

/// A request being built.
#[derive(Debug)]
pub struct Call(RequestBuilder);

/// `request.call()`: a [`Call`] on a client of the test's own.
pub trait IntoCall {
    fn call(self) -> Call;
}

impl IntoCall for RequestBuilder {
    fn call(self) -> Call {
        Call(self)
    }
}

impl Call {
    /// `method url` on a client of its own.
    pub fn new(method: Method, url: impl IntoUrl) -> Self {
        Self(Client::new().request(method, url))
    }

    pub fn get(url: impl IntoUrl) -> Self {
        Self::new(Method::GET, url)
    }

    pub fn post(url: impl IntoUrl) -> Self {
        Self::new(Method::POST, url)
    }

    pub fn put(url: impl IntoUrl) -> Self {
        Self::new(Method::PUT, url)
    }

    pub fn delete(url: impl IntoUrl) -> Self {
        Self::new(Method::DELETE, url)
    }

    /// A CORS preflight from `origin` asking for `GET`.
    pub fn preflight(url: impl IntoUrl, origin: &str) -> Self {
        Self::new(Method::OPTIONS, url)
            .origin(origin)
            .header("access-control-request-method", "GET")
    }

    pub fn header(self, name: &str, value: impl AsRef<str>) -> Self {
        Self(self.0.header(name, value.as_ref()))
    }

    /// Every header of `headers`.
    pub fn headers<N: AsRef<str>, V: AsRef<str>>(mut self, headers: &[(N, V)]) -> Self {
        for (name, value) in headers {
            self = self.header(name.as_ref(), value);
        }
        self
    }

    /// `apikey: key`.
    pub fn key(self, key: impl AsRef<str>) -> Self {
        self.header("apikey", key)
    }

    /// `Origin: origin`.
    pub fn origin(self, origin: impl AsRef<str>) -> Self {
        self.header("origin", origin)
    }

    /// `Host: host`.
    pub fn host(self, host: impl AsRef<str>) -> Self {
        self.header("host", host)
    }

    /// `Authorization: Bearer token`.
    pub fn bearer(self, token: impl std::fmt::Display) -> Self {
        Self(self.0.bearer_auth(token))
    }

    /// A console token of `user`.
    pub fn console(self, user: Uuid) -> Self {
        self.bearer(console_token(user))
    }

    pub fn json(self, body: &Value) -> Self {
        Self(self.0.json(body))
    }

    pub fn body(self, body: impl Into<reqwest::Body>) -> Self {
        Self(self.0.body(body))
    }

    pub fn timeout(self, timeout: std::time::Duration) -> Self {
        Self(self.0.timeout(timeout))
    }

    /// Sends; whatever came back, or the transport error.
    pub async fn try_send(self) -> reqwest::Result<Response> {
        self.0.send().await
    }

    /// Sends; the response, which must have come.
    pub async fn send(self) -> Response {
        self.try_send().await.expect("answer")
    }

    /// Sends; the status of the answer.
    pub async fn status(self) -> StatusCode {
        self.send().await.status()
    }

    /// Sends and reads the whole answer.
    pub async fn read(self) -> Answer {
        Answer::of(self.send().await).await
    }

    /// Sends and reads the whole answer, which must have status `status`.
    pub async fn expect<S>(self, status: S) -> Answer
    where
        StatusCode: PartialEq<S>,
        S: Debug,
    {
        let answer = self.read().await;
        assert_eq!(answer.status, status, "{}", answer.text());
        answer
    }
}

/// A whole answer.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub version: reqwest::Version,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// Reads `response` to its end.
    pub async fn of(response: Response) -> Self {
        let status = response.status();
        let version = response.version();
        let headers = response.headers().clone();
        let body = response.bytes().await.expect("body");
        Self {
            status,
            version,
            headers,
            body,
        }
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON, which it must be.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    /// The body as JSON, or `null` when it is not.
    pub fn json_or_null(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The status and the body as JSON (`null` when it is not).
    pub fn parts(&self) -> (StatusCode, Value) {
        (self.status, self.json_or_null())
    }

    /// The contract's error code (`error.code`) of a JSON error body.
    pub fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .expect("an error code")
            .to_owned()
    }

    /// The status and the contract's error code (empty when the body carries none).
    pub fn status_and_code(&self) -> (StatusCode, String) {
        let code = self.json_or_null()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        (self.status, code)
    }

    /// The value of header `name`, which must be there and be text.
    pub fn header(&self, name: &str) -> &str {
        self.headers[name].to_str().expect("a text header")
    }

    /// The request id the gateway stamped on the answer.
    pub fn request_id(&self) -> String {
        self.header("x-request-id").to_owned()
    }
}

/// A client sending [`TEST_KEY`] on every request.
pub fn client() -> Client {
    with_header("apikey", TEST_KEY.to_owned())
}

/// A client sending a console token of [`TEST_CONSOLE_USER`] on every request.
pub fn console_client() -> Client {
    let user = Uuid::parse_str(TEST_CONSOLE_USER).expect("uuid");
    with_header("authorization", format!("Bearer {}", console_token(user)))
}

fn with_header(name: &'static str, value: String) -> Client {
    let mut headers = HeaderMap::new();
    headers.insert(name, value.parse().expect("header"));
    Client::builder()
        .default_headers(headers)
        .build()
        .expect("client")
}
