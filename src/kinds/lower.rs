//! The lowering halves of the resource kinds (`kinds/<kind>/lower.rs`): each turns its
//! top-level block into resources with the evaluation engine (`config::lowering::Engine`). The
//! engine asks [`lower`] for a kind's and names no kind.

use super::KindId;
use crate::config::lowering::Lower;

macro_rules! define_lowerings {
    ($($(#[$meta:meta])* $variant:ident => $module:ident,)*) => {
        /// How a kind's top-level block becomes resources.
        pub fn lower(kind: KindId) -> Lower {
            match kind {
                $($(#[$meta])* KindId::$variant => super::$module::lower::lower,)*
            }
        }
    };
}
super::for_each_kind!(define_lowerings);
