// Rule 4's block means, the one device home: a G-block's summary key and value are the sums of its keys and
// values over its n_b tokens (G, or fewer in the ragged last block) times 1 / n_b. The factors come from the
// host (block_inverse, last_block_inverse: prepare.h prepare_ready, attn_setup.h for Lite's control CTAs);
// mean_factor picks the block's, block_mean applies it (prepare.h prepare_range and common/cond_rotation.h
// LitePrep), and the scalar preparation divides by the tokens it has summed (block_mean_of). Host and device code.
#pragma once

#include <cstdint>

#include "rules.h"

namespace rangeswa::cuda {

// 1 / G, the factor of a whole G-block.
inline float block_inverse(int32_t G) { return 1.f / float(G); }

// 1 / the tokens of the last of L's G-blocks (L - G floor((L - 1) / G)), as a float; 0 for no key.
inline float last_block_inverse(int32_t L, int32_t G) { return L > 0 ? 1.f / float(L - (L - 1) / G * G) : 0.f; }

// The factor of a block: a whole one's (`whole`: G tokens) or the ragged last one's. By reference: each read
// where the choice is made, as the callers read them (their SASS is as before the home).
RSWA_HD float mean_factor(bool whole, const float& inv_G, const float& inv_last) { return whole ? inv_G : inv_last; }

// A block's sum scaled to its mean by its factor.
RSWA_HD float block_mean(float sum, float factor) { return sum * factor; }

// The mean of the `tokens` keys a running sum holds (the scalar preparation's, by a division).
RSWA_HD float block_mean_of(float sum, float tokens) { return sum / tokens; }

}  // namespace rangeswa::cuda
