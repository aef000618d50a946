//! Intrusive doubly-linked lists over dense indices, several lists sharing one link array
//! (an index belongs to at most one list at a time). Front = most recent, back = oldest.

const NIL: u32 = u32::MAX;
const NONE: u16 = u16::MAX;

/// `n_lists` lists over indices `0..n`.
#[derive(Clone, Debug)]
pub(crate) struct Lists {
    prev: Vec<u32>,
    next: Vec<u32>,
    owner: Vec<u16>,
    head: Vec<u32>,
    tail: Vec<u32>,
    len: Vec<usize>,
}

impl Lists {
    /// Empty lists.
    pub(crate) fn new(n: usize, n_lists: usize) -> Self {
        Self {
            prev: vec![NIL; n],
            next: vec![NIL; n],
            owner: vec![NONE; n],
            head: vec![NIL; n_lists],
            tail: vec![NIL; n_lists],
            len: vec![0; n_lists],
        }
    }

    /// The list holding `i`, if any.
    pub(crate) fn owner(&self, i: usize) -> Option<usize> {
        (self.owner[i] != NONE).then_some(self.owner[i] as usize)
    }

    /// Number of entries in `list`.
    pub(crate) fn len(&self, list: usize) -> usize {
        self.len[list]
    }

    /// Pushes `i` (not in any list) at the front of `list`.
    pub(crate) fn push_front(&mut self, list: usize, i: usize) {
        debug_assert_eq!(self.owner[i], NONE);
        let h = self.head[list];
        self.prev[i] = NIL;
        self.next[i] = h;
        if h != NIL {
            self.prev[h as usize] = i as u32;
        } else {
            self.tail[list] = i as u32;
        }
        self.head[list] = i as u32;
        self.owner[i] = list as u16;
        self.len[list] += 1;
    }

    /// Unlinks `i` from whatever list holds it (no-op if none).
    pub(crate) fn remove(&mut self, i: usize) {
        let Some(list) = self.owner(i) else { return };
        let (p, n) = (self.prev[i], self.next[i]);
        if p != NIL {
            self.next[p as usize] = n;
        } else {
            self.head[list] = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        } else {
            self.tail[list] = p;
        }
        self.owner[i] = NONE;
        self.len[list] -= 1;
    }

    /// Moves `i` to the front of `list` (from any list or none).
    pub(crate) fn move_front(&mut self, list: usize, i: usize) {
        self.remove(i);
        self.push_front(list, i);
    }

    /// The oldest entry of `list`.
    pub(crate) fn back(&self, list: usize) -> Option<usize> {
        let t = self.tail[list];
        (t != NIL).then_some(t as usize)
    }

    /// Entries of `list` from oldest to newest.
    pub(crate) fn iter_back(&self, list: usize) -> impl Iterator<Item = usize> + '_ {
        let mut cur = self.tail[list];
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let i = cur as usize;
            cur = self.prev[i];
            Some(i)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_move_remove() {
        let mut l = Lists::new(8, 2);
        l.push_front(0, 1);
        l.push_front(0, 2);
        l.push_front(1, 3);
        assert_eq!(l.iter_back(0).collect::<Vec<_>>(), vec![1, 2]);
        l.move_front(0, 1);
        assert_eq!(l.iter_back(0).collect::<Vec<_>>(), vec![2, 1]);
        l.move_front(0, 3);
        assert_eq!(l.len(1), 0);
        assert_eq!(l.back(1), None);
        l.remove(2);
        assert_eq!(l.iter_back(0).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(l.owner(2), None);
        assert_eq!(l.owner(3), Some(0));
    }
}
