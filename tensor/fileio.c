/* fileio.c — being written */
