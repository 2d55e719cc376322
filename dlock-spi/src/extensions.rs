//! A typed map handlers use to pass data to each other within one call.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};

type AnyMap = HashMap<TypeId, Box<dyn Any + Send + Sync>>;

/// Values keyed by type, shared by the handlers of one acquire or release.
///
/// Allocates only when the first value is inserted, so handlers that do not use it
/// cost nothing. Interior mutability lets handlers write through `&Context`.
#[derive(Default)]
pub struct Extensions {
    map: Mutex<Option<Box<AnyMap>>>,
}

impl Extensions {
    /// An empty map (no allocation).
    pub const fn new() -> Self {
        Extensions {
            map: Mutex::new(None),
        }
    }

    /// Stores `value`, returning the previous value of the same type.
    pub fn insert<T: Send + Sync + 'static>(&self, value: T) -> Option<T> {
        let mut guard = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        guard
            .get_or_insert_with(Box::default)
            .insert(TypeId::of::<T>(), Box::new(value))
            .and_then(|old| old.downcast::<T>().ok().map(|b| *b))
    }

    /// A clone of the stored value of type `T`.
    pub fn get<T: Clone + Send + Sync + 'static>(&self) -> Option<T> {
        let guard = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        guard
            .as_ref()?
            .get(&TypeId::of::<T>())?
            .downcast_ref::<T>()
            .cloned()
    }

    /// Removes and returns the stored value of type `T`.
    pub fn remove<T: Send + Sync + 'static>(&self) -> Option<T> {
        let mut guard = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        guard
            .as_mut()?
            .remove(&TypeId::of::<T>())
            .and_then(|old| old.downcast::<T>().ok().map(|b| *b))
    }

    /// Whether no value is stored.
    pub fn is_empty(&self) -> bool {
        let guard = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        guard.as_ref().is_none_or(|m| m.is_empty())
    }
}

impl fmt::Debug for Extensions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let guard = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Extensions")
            .field("len", &guard.as_ref().map_or(0, |m| m.len()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_insert_get_remove() {
        let ext = Extensions::new();
        assert!(ext.is_empty());
        assert_eq!(ext.insert(5u32), None);
        assert_eq!(ext.insert(7u32), Some(5));
        assert_eq!(ext.insert("tag"), None);
        assert_eq!(ext.get::<u32>(), Some(7));
        assert_eq!(ext.get::<&str>(), Some("tag"));
        assert_eq!(ext.remove::<u32>(), Some(7));
        assert_eq!(ext.get::<u32>(), None);
        assert!(!ext.is_empty());
    }
}
