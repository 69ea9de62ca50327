# Writes <libdir>/pkgconfig/kdispatch.pc at install time (install(SCRIPT)),
# with the prefix the install really uses (`cmake --install --prefix` and
# DESTDIR included): Cflags -I<includedir>; Libs -L<libdir> -lkdispatch and,
# unless <libdir> is one the linker searches by default, -Wl,-rpath,<libdir>
# so a program built with `pkg-config --libs kdispatch` runs without
# LD_LIBRARY_PATH; outside the system dirs the paths are ${pcfiledir}-relative
# (relocatable). Inputs (set by the install(CODE) before it):
# KD_PC_LIBDIR, KD_PC_INCLUDEDIR (relative to the prefix, or absolute),
# KD_PC_VERSION, KD_PC_SYSTEM_DIRS (the linker's implicit dirs).
foreach(v LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${KD_PC_${v}}")
    set(_${v} "${KD_PC_${v}}")
  else()
    set(_${v} "${CMAKE_INSTALL_PREFIX}/${KD_PC_${v}}")
  endif()
endforeach()
set(_rpath " -Wl,-rpath,\${libdir}")
foreach(d IN LISTS KD_PC_SYSTEM_DIRS)
  get_filename_component(d "${d}" REALPATH)
  get_filename_component(l "${_LIBDIR}" REALPATH)
  if(d STREQUAL l)
    set(_rpath "")
  endif()
endforeach()
set(_pc "$ENV{DESTDIR}${_LIBDIR}/pkgconfig/kdispatch.pc")
# Outside the system dirs the paths are relative to the .pc file itself
# (${pcfiledir}), so a relocated install (a pip wheel, a moved prefix)
# still answers its own paths; in a system dir, absolute.
set(_pfx "${CMAKE_INSTALL_PREFIX}")
set(_lib "${_LIBDIR}")
set(_inc "${_INCLUDEDIR}")
if(_rpath)
  file(RELATIVE_PATH _r_pfx "${_LIBDIR}/pkgconfig" "${CMAKE_INSTALL_PREFIX}")
  file(RELATIVE_PATH _r_lib "${_LIBDIR}/pkgconfig" "${_LIBDIR}")
  file(RELATIVE_PATH _r_inc "${_LIBDIR}/pkgconfig" "${_INCLUDEDIR}")
  set(_pfx "\${pcfiledir}/${_r_pfx}")
  set(_lib "\${pcfiledir}/${_r_lib}")
  set(_inc "\${pcfiledir}/${_r_inc}")
endif()
file(WRITE "${_pc}" "prefix=${_pfx}
libdir=${_lib}
includedir=${_inc}

Name: kdispatch
Description: Per-call GPU/CPU kernel variant and launch-config dispatch (C ABI <dispatch/c_api.h>, C++20 API <dispatch/dispatch.hpp>)
Version: ${KD_PC_VERSION}
Cflags: -I\${includedir}
Libs: -L\${libdir}${_rpath} -lkdispatch
")
message(STATUS "Installing: ${_pc}")
