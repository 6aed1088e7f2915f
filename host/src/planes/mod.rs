//! The two planes: one set of service routes ([`routes`]), each plane's extra routes and router
//! ([`data`], [`management`]), and the request path both share: one service per plane running
//! the phases in order ([`chain`]).

pub mod admin;
pub mod admin_token;
pub mod auth_settings;
pub mod chain;
pub mod data;
pub mod handlers;
pub mod issuers;
pub mod management;
pub mod policies;
pub mod project_route;
pub mod routes;

pub use data::build_data_plane_router;
pub use management::build_management_plane_router;
