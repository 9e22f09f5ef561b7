//! What a node is, read over the transport (`hosts`): its facts (OS, memory, GPUs, driver,
//! memlock, Docker, interfaces), its RDMA fabric from sysfs, and the NCCL its images carry;
//! the one command a plan reads them all with (`glance`).
//! Apart from `hosts`, which only carries commands and Docker requests to the machines.

pub mod fabric;
pub mod facts;
pub mod glance;
pub mod ip_addr;
pub mod nccl;
