//! The two planes.

/// Which listener a request arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plane {
    /// Public SDK traffic.
    Data,
    /// Console traffic.
    Management,
}

impl Plane {
    /// Both planes.
    pub const ALL: [Plane; 2] = [Plane::Data, Plane::Management];

    /// The plane named `data` or `management`.
    pub fn parse(name: &str) -> Option<Plane> {
        match name {
            "data" => Some(Plane::Data),
            "management" => Some(Plane::Management),
            _ => None,
        }
    }

    /// `data` or `management`.
    pub fn as_str(self) -> &'static str {
        match self {
            Plane::Data => "data",
            Plane::Management => "management",
        }
    }
}

impl std::fmt::Display for Plane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
