# `cmake --install`: the daemon and its tools, the systemd unit, the default config and the
# user documentation (docs/operations.md, Install).
#
#   <prefix>/bin                      salus-server salusctl salus-devices salus-run salus-sim
#   <prefix>/lib/systemd/system       salus-server.service (its paths filled in)
#   SALUS_CONFIG_DIR (/etc/salus)     salus.json, only when none is there: an edited config stays
#   <prefix>/share/doc/salus          README.md, CHANGELOG.md and docs/
include(GNUInstallDirs)
set(SALUS_CONFIG_DIR "/etc/salus" CACHE PATH
    "Where the installed service reads salus.json (an absolute path; DESTDIR applies)")

install(TARGETS salus-server salusctl salus-devices salus-run salus-sim
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

configure_file(${PROJECT_SOURCE_DIR}/docker/salus-server.service.in
               ${PROJECT_BINARY_DIR}/salus-server.service @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/salus-server.service
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/systemd/system)

install(CODE "
  set(config \"\$ENV{DESTDIR}${SALUS_CONFIG_DIR}/salus.json\")
  if(EXISTS \"\${config}\")
    message(STATUS \"Kept: \${config}\")
  else()
    # (file(INSTALL) puts DESTDIR in front itself)
    file(INSTALL \"${PROJECT_SOURCE_DIR}/docker/salus.json\" DESTINATION \"${SALUS_CONFIG_DIR}\")
  endif()
")

install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/CHANGELOG.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR})
