// The memory plan as `moe-train plan` prints it (src/plan/plan_report.cpp): the table and
// verdict, or (--json) its figures in bytes.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "moe/config/config.h"
#include "moe/plan/memory_plan.h"

namespace moe::plan {

// The table and verdict as `moe-train plan` prints them.
std::string format_plan(const config::Config& cfg, const PlanOptions& opt, const MemoryPlan& p);

// The figures as `moe-train plan --json` prints them (bytes; the verdict with a device size).
nlohmann::json plan_json(const PlanOptions& opt, const MemoryPlan& p);

// "141GiB", "80GB", "24 GiB", "1e9" -> bytes; UserError naming `what` otherwise.
double parse_memory_size(const std::string& text, const std::string& what);

}  // namespace moe::plan
