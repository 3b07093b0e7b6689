// The report page's assets, embedded at build time (reports/embed_assets.cmake): the template
// (reports/report_template.html) and d3 v5's bundle from Debian's node-d3.
#pragma once

#include <string_view>

namespace megaplan {

std::string_view report_template_html();
std::string_view d3_min_js();

}  // namespace megaplan
