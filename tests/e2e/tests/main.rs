//! The end-to-end tests, one binary: each module is one area of the
//! mission. One process lets the harness run tests of different areas side
//! by side (`RUST_TEST_THREADS`, set by `tests/run.sh`) and links once.
//! Run one area with `cargo test -p liqo-e2e --test e2e <module>::`.

mod apiserver_control;
mod bad_input;
mod cidrs;
mod clusterset;
mod discovery;
mod gateway;
mod grant_following;
mod grant_shares;
mod hostnode;
mod hostnode_failures;
mod images;
mod install;
mod kubelet_api;
mod kubelet_api_metrics;
mod nat;
mod network;
mod offloading;
mod offloading_jobs;
mod offloading_rbac;
mod offloading_refusals;
mod offloading_restart;
mod ownership;
mod peering;
mod peering_rollback;
mod placement;
mod placement_levels;
mod placement_webhook;
mod provider_hardening;
mod provider_hardening_doors;
mod provider_hardening_storage;
mod provider_hardening_terms;
mod provider_hardening_workloads;
mod real_node_faults;
mod real_node_storage;
mod real_node_storage_offloaded;
mod real_nodes;
mod reflection;
mod sharing_policy;
mod storage_kept;
mod test_network;
mod testbed_cli;
mod testbed_pod_network;
mod testbed_smoke;
mod tethering;
mod tokens;
mod tunnel;
mod tunnel_cannot_run;
mod twin_namespaces;
mod unplaceable;
mod virtual_node;
