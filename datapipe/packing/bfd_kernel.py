"""The compiled best-fit-decreasing loop behind datapipe.packing.bfd (numba; imported only when packing runs).

Sorting is a counting sort on length (O(n + capacity), stable). Open sequences are
indexed by their remaining room (0..capacity) in a 64-ary bit tree: bit r of level 0
says some open sequence has exactly r tokens of room, a bit of level k+1 says its
64-bit word on level k is not zero. The tightest fit for an item is the first set
bit at or after its length: at most two walks of log64(capacity) words (3 at 8K..64K,
4 at 256K..1M), each a mask and a count of trailing zeros. Each room value keeps a stack of
its sequences, so the result is the same as a sorted list of rooms, only faster.
"""
from __future__ import annotations

import numpy as np
from numba import njit

ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
DE_BRUIJN = np.uint64(0x03F79D71B4CB0A89)  # (lowest bit * this) >> 58 is unique for each bit position
DE_BRUIJN_INDEX = np.zeros(64, dtype=np.int64)
for _bit in range(64):
    DE_BRUIJN_INDEX[((1 << _bit) * 0x03F79D71B4CB0A89 & 0xFFFFFFFFFFFFFFFF) >> 58] = _bit


@njit(cache=True, nogil=True)
def best_fit_decreasing_loop(lengths, capacity, bins):
    """Write each item's sequence index (items longest first, tightest fit) to bins; return the count."""
    order = counting_sort_descending(lengths, capacity)
    offsets, widths, words = bit_tree(capacity + 1)
    head = np.full(capacity + 1, -1, np.int64)  # top of each room value's stack of open sequences
    below = np.full(len(lengths), -1, np.int64)  # the next sequence down the same stack
    num_bins = 0
    sorted_lengths = lengths[order]  # walked in order: sequential reads instead of a cache miss per item
    sorted_bins = np.empty(len(order), np.int64)
    for k in range(len(order)):
        need = sorted_lengths[k]
        room = first_set_at_least(words, offsets, widths, need)
        if room < 0:
            b, room = num_bins, capacity
            num_bins += 1
        else:
            b = head[room]
            head[room] = below[b]
            if head[room] < 0:
                clear_bit(words, offsets, room)
        sorted_bins[k] = b
        left = room - need
        if left > 0:
            below[b] = head[left]
            if head[left] < 0:
                set_bit(words, offsets, left)
            head[left] = b
    bins[order] = sorted_bins
    return num_bins


@njit(cache=True, nogil=True)
def counting_sort_descending(lengths, capacity):
    """Item indices by length, longest first; equal lengths keep input order."""
    starts = np.zeros(capacity + 2, np.int64)
    for length in lengths:
        starts[capacity - length + 1] += 1
    for value in range(1, capacity + 2):
        starts[value] += starts[value - 1]
    order = np.empty(len(lengths), np.int64)
    for i in range(len(lengths)):
        slot = capacity - lengths[i]
        order[starts[slot]] = i
        starts[slot] += 1
    return order


@njit(cache=True, nogil=True)
def bit_tree(num_bits):
    """Word offsets and widths per level, and the zeroed words, of a 64-ary tree over num_bits."""
    widths, width = [], num_bits
    while True:
        width = (width + 63) // 64
        widths.append(width)
        if width == 1:
            break
    offsets = np.zeros(len(widths), np.int64)
    for level in range(1, len(widths)):
        offsets[level] = offsets[level - 1] + widths[level - 1]
    return offsets, np.array(widths, np.int64), np.zeros(offsets[-1] + 1, np.uint64)


@njit(cache=True, nogil=True)
def lowest_bit(word):
    return DE_BRUIJN_INDEX[((word & (~word + np.uint64(1))) * DE_BRUIJN) >> np.uint64(58)]


@njit(cache=True, nogil=True)
def first_set_at_least(words, offsets, widths, low):
    """The smallest set bit index >= low on level 0, or -1."""
    level, index = 0, low
    while True:
        word_index = index >> 6
        if word_index >= widths[level]:
            return -1
        word = words[offsets[level] + word_index] & (ONES << np.uint64(index & 63))
        if word != 0:
            index = (word_index << 6) + lowest_bit(word)
            break
        level += 1
        if level == len(widths):
            return -1
        index = word_index + 1
    while level > 0:
        level -= 1
        index = (index << 6) + lowest_bit(words[offsets[level] + index])
    return index


@njit(cache=True, nogil=True)
def set_bit(words, offsets, index):
    for level in range(len(offsets)):
        slot = offsets[level] + (index >> 6)
        was_empty = words[slot] == 0
        words[slot] |= np.uint64(1) << np.uint64(index & 63)
        if not was_empty:
            return
        index >>= 6


@njit(cache=True, nogil=True)
def clear_bit(words, offsets, index):
    for level in range(len(offsets)):
        slot = offsets[level] + (index >> 6)
        words[slot] &= ~(np.uint64(1) << np.uint64(index & 63))
        if words[slot] != 0:
            return
        index >>= 6


@njit(cache=True, nogil=True)
def group_by_bin(bins, num_bins):
    """Item indices grouped by sequence (a stable counting sort) and each group's start offset."""
    offsets = np.zeros(num_bins + 1, np.int64)
    for b in bins:
        offsets[b + 1] += 1
    for b in range(num_bins):
        offsets[b + 1] += offsets[b]
    cursor = offsets[:-1].copy()
    order = np.empty(len(bins), np.int64)
    for i in range(len(bins)):
        order[cursor[bins[i]]] = i
        cursor[bins[i]] += 1
    return order, offsets


@njit(cache=True, nogil=True)
def split_at(docs, lengths, seq_len):
    """Pieces (doc, start, length) of at most seq_len tokens, in order: one pass, no temporaries."""
    total = 0
    for length in lengths:
        total += (length + seq_len - 1) // seq_len
    piece_doc, piece_start, piece_len = np.empty(total, np.int64), np.empty(total, np.int64), np.empty(total, np.int64)
    k = 0
    for i in range(len(lengths)):
        for start in range(0, lengths[i], seq_len):
            piece_doc[k], piece_start[k], piece_len[k] = docs[i], start, min(seq_len, lengths[i] - start)
            k += 1
    return piece_doc, piece_start, piece_len
