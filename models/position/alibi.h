// ALiBi's slopes (alibi.cpp): m_h of each head h = 1..H, as in Press et al.'s code.
#pragma once

#include <cstdint>
#include <vector>

namespace models {

std::vector<double> alibi_slopes(int64_t heads);

}  // namespace models
