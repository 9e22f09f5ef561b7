//! A container as the runtime makes it: the parts of Docker's create body sparkform sets, in
//! its own words, and the body made from them. The container kind maps its desired
//! configuration onto a [`ContainerSpec`]; the helpers of other kinds (a benchmark's client, a
//! fabric test's rank) build one directly, so no kind builds containers from another kind's
//! configuration.

use std::collections::{BTreeMap, HashMap};

use bollard::models::{
    ContainerCreateBody, DeviceMapping, DeviceRequest, HostConfig, ResourcesUlimits, RestartPolicy,
    RestartPolicyNameEnum,
};

/// What a container is made from. `None` leaves a part to the image or to Docker's default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerSpec {
    pub image: String,
    pub command: Option<Vec<String>>,
    pub entrypoint: Option<Vec<String>>,
    pub env: Option<BTreeMap<String, String>>,
    pub labels: HashMap<String, String>,
    pub user: Option<String>,
    pub working_dir: Option<String>,
    pub stop_timeout: Option<i64>,
    pub network_mode: Option<String>,
    pub ipc_mode: Option<String>,
    pub pid_mode: Option<String>,
    pub shm_size: Option<i64>,
    /// NVIDIA GPUs to request: a count, or -1 for all.
    pub gpus: Option<i64>,
    /// `HOST[:INSIDE[:PERMISSIONS]]`.
    pub devices: Option<Vec<String>>,
    /// `HOST:INSIDE[:OPTIONS]`.
    pub volumes: Option<Vec<String>>,
    /// By name: `SOFT[:HARD]`, each a number or `unlimited`.
    pub ulimits: Option<BTreeMap<String, String>>,
    pub cap_add: Option<Vec<String>>,
    pub privileged: Option<bool>,
    /// `no`, `always`, `unless-stopped`, `on-failure[:N]`.
    pub restart: Option<String>,
}

impl ContainerSpec {
    /// Docker's create body for it.
    pub fn body(&self) -> ContainerCreateBody {
        let env = self
            .env
            .as_ref()
            .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect());
        let device_requests = self.gpus.map(|count| {
            vec![DeviceRequest {
                driver: Some("nvidia".into()),
                count: Some(count),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..Default::default()
            }]
        });
        let devices = self
            .devices
            .as_ref()
            .map(|ds| ds.iter().map(|d| device(d)).collect());
        let ulimits = self.ulimits.as_ref().map(|m| {
            m.iter()
                .map(|(name, text)| {
                    let (soft, hard) = ulimit_pair(text);
                    ResourcesUlimits {
                        name: Some(name.clone()),
                        soft: Some(soft),
                        hard: Some(hard),
                    }
                })
                .collect()
        });
        ContainerCreateBody {
            image: Some(self.image.clone()),
            cmd: self.command.clone(),
            entrypoint: self.entrypoint.clone(),
            env,
            labels: Some(self.labels.clone()),
            user: self.user.clone(),
            working_dir: self.working_dir.clone(),
            stop_timeout: self.stop_timeout,
            host_config: Some(HostConfig {
                network_mode: self.network_mode.clone(),
                ipc_mode: self.ipc_mode.clone(),
                pid_mode: self.pid_mode.clone(),
                shm_size: self.shm_size,
                device_requests,
                devices,
                binds: self.volumes.clone(),
                ulimits,
                cap_add: self.cap_add.clone(),
                privileged: self.privileged,
                restart_policy: self.restart.as_deref().map(restart_policy),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The body of a one-shot helper (a fabric test's rank, a benchmark's client): labelled
    /// `label` = `lineage` only, so refresh never takes it for a container of the deployment.
    pub fn helper_body(mut self, label: &str, lineage: &str) -> ContainerCreateBody {
        self.labels = HashMap::from([(label.to_string(), lineage.to_string())]);
        self.body()
    }
}

/// `HOST[:INSIDE[:PERMISSIONS]]` as Docker's mapping.
fn device(text: &str) -> DeviceMapping {
    let (host, inside, permissions) = device_triple(text);
    DeviceMapping {
        path_on_host: Some(host),
        path_in_container: Some(inside),
        cgroup_permissions: Some(permissions),
    }
}

/// A device mapping as (host, container, permissions), from `/dev/x[:/dev/y[:rwm]]`: inside
/// defaults to the host's path, permissions to `rwm`.
pub fn device_triple(text: &str) -> (String, String, String) {
    let mut parts = text.split(':');
    let host = parts.next().unwrap_or_default().to_string();
    let inside = parts
        .next()
        .map(str::to_string)
        .unwrap_or_else(|| host.clone());
    let permissions = parts.next().unwrap_or("rwm").to_string();
    (host, inside, permissions)
}

/// `SOFT[:HARD]` of a ulimit as numbers (one number is both).
pub fn ulimit_pair(text: &str) -> (i64, i64) {
    match text.split_once(':') {
        Some((s, h)) => (ulimit_value(s), ulimit_value(h)),
        None => (ulimit_value(text), ulimit_value(text)),
    }
}

/// `no`, `always`, `unless-stopped`, `on-failure[:N]` as Docker's policy (anything else: `no`).
pub fn restart_policy(text: &str) -> RestartPolicy {
    let (name, count) = match text.split_once(':') {
        Some((n, c)) => (n, c.parse().ok()),
        None => (text, None),
    };
    RestartPolicy {
        name: Some(match name {
            "always" => RestartPolicyNameEnum::ALWAYS,
            "unless-stopped" => RestartPolicyNameEnum::UNLESS_STOPPED,
            "on-failure" => RestartPolicyNameEnum::ON_FAILURE,
            _ => RestartPolicyNameEnum::NO,
        }),
        maximum_retry_count: count,
    }
}

/// A ulimit's number: `unlimited` (or `-1`, or what does not read) is -1.
pub fn ulimit_value(s: &str) -> i64 {
    match s {
        "unlimited" | "-1" => -1,
        n => n.parse().unwrap_or(-1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_helper_carries_only_its_label_and_the_parts_it_sets() {
        let spec = ContainerSpec {
            image: "img:1".into(),
            entrypoint: Some(vec!["python3".into(), "-c".into(), "x".into()]),
            labels: HashMap::from([("other".to_string(), "x".to_string())]),
            gpus: Some(-1),
            devices: Some(vec!["/dev/infiniband".into(), "/dev/a:/dev/b:r".into()]),
            ulimits: Some(BTreeMap::from([("memlock".to_string(), "-1".to_string())])),
            ..Default::default()
        };
        let body = spec.helper_body("sparkform.helper", "lin");
        assert_eq!(
            body.labels,
            Some(HashMap::from([(
                "sparkform.helper".to_string(),
                "lin".to_string()
            )]))
        );
        let host = body.host_config.unwrap();
        assert_eq!(host.device_requests.unwrap()[0].count, Some(-1));
        let devices = host.devices.unwrap();
        assert_eq!(
            devices[0].path_in_container.as_deref(),
            Some("/dev/infiniband")
        );
        assert_eq!(devices[1].cgroup_permissions.as_deref(), Some("r"));
        assert_eq!(host.ulimits.unwrap()[0].soft, Some(-1));
        assert_eq!(host.restart_policy, None);
        assert_eq!(body.cmd, None);
    }

    #[test]
    fn restart_policies_read_as_docker_names_them() {
        let p = restart_policy("on-failure:3");
        assert_eq!(p.name, Some(RestartPolicyNameEnum::ON_FAILURE));
        assert_eq!(p.maximum_retry_count, Some(3));
        assert_eq!(
            restart_policy("sometimes").name,
            Some(RestartPolicyNameEnum::NO)
        );
        assert_eq!(ulimit_value("unlimited"), -1);
        assert_eq!(ulimit_value("1024"), 1024);
    }
}
