//! Transfers running now, per device and in all, so a device that opens
//! streams in a loop holds at most [`MAX_TRANSFERS_PER_DEVICE`] blocking
//! threads and the workstation at most [`MAX_TRANSFERS`].

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use iroh::EndpointId;

use super::{MAX_TRANSFERS, MAX_TRANSFERS_PER_DEVICE};

#[derive(Debug, Default)]
pub struct InFlight {
    per: Mutex<HashMap<EndpointId, usize>>,
}

/// One running transfer; ends when dropped.
#[derive(Debug)]
pub struct Running {
    of: Arc<InFlight>,
    device: EndpointId,
}

impl InFlight {
    /// A transfer for `device`, if it and the workstation are under their caps.
    pub fn begin(self: &Arc<Self>, device: EndpointId) -> Option<Running> {
        let mut per = self.per.lock().unwrap_or_else(|p| p.into_inner());
        let all: usize = per.values().sum();
        let mine = per.entry(device).or_default();
        if *mine >= MAX_TRANSFERS_PER_DEVICE || all >= MAX_TRANSFERS {
            return None;
        }
        *mine += 1;
        Some(Running { of: self.clone(), device })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut per = self.of.per.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = per.get_mut(&self.device) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.device);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_runs_its_share_and_gets_it_back() {
        let f = Arc::new(InFlight::default());
        let a = iroh::SecretKey::from_bytes(&[1; 32]).public();
        let b = iroh::SecretKey::from_bytes(&[2; 32]).public();
        let held: Vec<_> = (0..MAX_TRANSFERS_PER_DEVICE).map(|_| f.begin(a).unwrap()).collect();
        assert!(f.begin(a).is_none());
        assert!(f.begin(b).is_some(), "another device is not held up");
        drop(held);
        assert!(f.begin(a).is_some());
    }
}
