//! A NATed connection's two tuples as the records keep them (issue 45): the socket's and the
//! wire's, joined by the sampler through the connection tracker (`sys::conntrack`).
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A NATed connection's two tuples (issue 45): `original` the socket's (the row's, e.g. a
/// Service), `translated` the packets' on the sampler's interface (e.g. its backend).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Nat {
    pub original: Endpoints,
    pub translated: Endpoints,
}

/// A local and a remote address with ports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Endpoints {
    pub local: String,
    pub remote: String,
}

impl Nat {
    /// The tuples of a socket's flow and of the wire's.
    pub fn of(socket: &crate::analysis::flow::Flow, wire: &crate::analysis::flow::Flow) -> Nat {
        let e = |f: &crate::analysis::flow::Flow| (f.local.to_string(), f.remote.to_string());
        let ((l, r), (wl, wr)) = (e(socket), e(wire));
        let (original, translated) = (
            Endpoints {
                local: l,
                remote: r,
            },
            Endpoints {
                local: wl,
                remote: wr,
            },
        );
        Nat {
            original,
            translated,
        }
    }
}
