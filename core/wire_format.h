// A versioned, bounds-checked binary encoding of RequestList and ResponseList. Parsing never trusts
// its input: truncated or corrupted bytes give an error Status, never a crash or a huge allocation.
#pragma once

#include <string>

#include "core/message.h"
#include "core/status.h"

namespace hvdc {

constexpr uint32_t kWireMagic = 0x43445648;  // "HVDC"
constexpr uint16_t kWireVersion = 1;

std::string SerializeRequestList(const RequestList& list);
Status ParseRequestList(const std::string& bytes, RequestList* out);
std::string SerializeResponseList(const ResponseList& list);
Status ParseResponseList(const std::string& bytes, ResponseList* out);

}  // namespace hvdc
