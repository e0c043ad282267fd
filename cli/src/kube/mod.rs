//! What every command does with a cluster's API: apply and delete our
//! objects ([`apply`]), tell ours from someone else's ([`ownership`]), and
//! wait for a state with a deadline ([`wait`]), and for our agents to be
//! ready ([`agents`]); and what commands read of an installation
//! ([`cluster`]).

pub mod agents;
pub mod apply;
pub mod cluster;
pub mod ownership;
pub mod wait;
