//! The status the API should show for a pod and its containers: phase,
//! conditions (with their transition times), addresses and each
//! container's state, as a kubelet reports them.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::super::probe::Prober;
use super::{ContainerRuntime, Image, PodRuntime};

impl PodRuntime {
    /// The status to write, if it differs from the one last written.
    pub(in crate::hostnode) fn status_if_changed(&mut self, pod: &Pod) -> Option<PodStatus> {
        let status = self.status(pod);
        (self.posted.as_ref() != Some(&status)).then_some(status)
    }

    /// Notes that `status` is what the API now shows.
    pub(in crate::hostnode) fn posted(&mut self, status: PodStatus) {
        self.posted = Some(status);
    }

    fn status(&mut self, pod: &Pod) -> PodStatus {
        let containers: Vec<ContainerStatus> = self
            .containers
            .iter()
            .map(ContainerRuntime::status)
            .collect();
        let ready = containers.iter().all(|c| c.ready);
        let scheduled = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
            .cloned();
        // As a kubelet says it, and why, when this node knows better.
        let unready: Vec<&str> = (self.containers.iter())
            .filter(|c| !c.ready())
            .map(|c| c.spec.name.as_str())
            .collect();
        let why = (self.containers.iter())
            .find_map(|c| c.never_ready)
            .map(|why| format!(" ({why})"))
            .unwrap_or_default();
        let not_ready = (!ready).then(|| {
            (
                "ContainersNotReady",
                format!(
                    "containers with unready status: [{}]{why}",
                    unready.join(" ")
                ),
            )
        });
        let mut ready_condition = |type_| {
            let mut c = self.condition(type_, ready);
            if let Some((reason, message)) = &not_ready {
                c.reason = Some((*reason).to_owned());
                c.message = Some(message.clone());
            }
            c
        };
        let containers_ready = ready_condition("ContainersReady");
        let ready_condition = ready_condition("Ready");
        let conditions = vec![
            scheduled.unwrap_or_else(|| self.condition("PodScheduled", true)),
            self.condition("Initialized", true),
            containers_ready,
            ready_condition,
        ];
        let host = self.network.host_ip.to_string();
        PodStatus {
            phase: Some(self.phase().to_owned()),
            conditions: Some(conditions),
            container_statuses: Some(containers),
            host_ip: Some(host.clone()),
            host_ips: Some(vec![HostIP { ip: host }]),
            pod_ip: Some(self.ip.to_string()),
            pod_ips: Some(vec![PodIP {
                ip: self.ip.to_string(),
            }]),
            start_time: Some(Time(self.start_time)),
            ..Default::default()
        }
    }

    fn condition(&mut self, type_: &'static str, ok: bool) -> PodCondition {
        let (_, since) = self
            .transitions
            .entry(type_)
            .and_modify(|(was, since)| {
                if *was != ok {
                    *was = ok;
                    *since = Timestamp::now();
                }
            })
            .or_insert_with(|| (ok, Timestamp::now()));
        PodCondition {
            type_: type_.to_owned(),
            status: if ok { "True" } else { "False" }.to_owned(),
            last_transition_time: Some(Time(*since)),
            ..Default::default()
        }
    }

    fn phase(&self) -> &'static str {
        let policy = self.restart_policy;
        let finished = |c: &ContainerRuntime| {
            c.running.is_none()
                && c.last
                    .as_ref()
                    .is_some_and(|t| !c.may_restart(policy, t.exit_code))
        };
        if self.containers.iter().all(finished) && !self.containers.is_empty() {
            let succeeded = self
                .containers
                .iter()
                .all(|c| c.last.as_ref().is_some_and(|t| t.exit_code == 0));
            return if succeeded { "Succeeded" } else { "Failed" };
        }
        if self.containers.iter().all(|c| c.started_once) {
            "Running"
        } else {
            "Pending"
        }
    }
}

impl ContainerRuntime {
    fn ready(&self) -> bool {
        self.running.is_some()
            && self.never_ready.is_none()
            && self.startup.as_ref().is_none_or(Prober::healthy)
            && self.readiness.as_ref().is_none_or(Prober::healthy)
    }

    fn status(&self) -> ContainerStatus {
        let running = |started_at: &Timestamp| ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(*started_at)),
            }),
            ..Default::default()
        };
        let terminated = |t: &ContainerStateTerminated| ContainerState {
            terminated: Some(t.clone()),
            ..Default::default()
        };
        let (state, last_state) = match (&self.running, &self.waiting, &self.last) {
            (Some(r), _, last) => (running(&r.started_at), last.as_ref().map(terminated)),
            (None, Some((reason, message)), last) => (
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some((*reason).to_owned()),
                        message: Some(message.clone()),
                    }),
                    ..Default::default()
                },
                last.as_ref().map(terminated),
            ),
            (None, None, Some(last)) => (terminated(last), None),
            (None, None, None) => (
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some("ContainerCreating".to_owned()),
                        message: None,
                    }),
                    ..Default::default()
                },
                None,
            ),
        };
        ContainerStatus {
            name: self.spec.name.clone(),
            image: self.spec.image.clone().unwrap_or_default(),
            image_id: match &self.image {
                Image::Binary(b) => format!("hostprocess://{}", b.display()),
                Image::Unpullable(_) => String::new(),
            },
            container_id: self
                .running
                .as_ref()
                .map(|r| r.id.clone())
                .or_else(|| self.last.as_ref().and_then(|t| t.container_id.clone())),
            ready: self.ready(),
            started: Some(self.running.is_some()),
            restart_count: self.restart_count,
            state: Some(state),
            last_state,
            ..Default::default()
        }
    }
}
