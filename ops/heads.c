/* heads.c — being written */
